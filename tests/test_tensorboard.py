"""A real TensorBoard server, started on loopback, serves what a user looks for in a run of train.py."""

import json
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from app.runs import METRICS as HPARAMS_METRICS
from tests.helpers import REPO, free_port, run_job, small_run

RUN = "ConvNet-mnist/version_0"
STATUSES = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]


@pytest.fixture(scope="module")
def log_root(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A ConvNet run of 2 epochs: its runs folder, and the dashboard command it printed."""
    root = tmp_path_factory.mktemp("runs")
    options = ("--trainer.log_every_n_steps", "2", "--dashboard.log_graph", "true")
    result = run_job(
        2, *small_run(data_dir, root, *options, model="ConvNet", max_epochs=2, devices=2), folder=root / "logs"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (dashboard,) = [line for line in result.stdout.splitlines() if line.startswith("Dashboard: ")]
    return root, dashboard.removeprefix("Dashboard: ")


@pytest.fixture(scope="module")
def tensorboard(log_root: tuple[Path, str]):
    """The base URL of the dashboard command the run printed, as printed (`.venv/bin/tensorboard --logdir <runs>`
    where the environment is not activated), with `--host 127.0.0.1 --port <free port>`; stopped afterwards."""
    root, printed = log_root
    assert printed.endswith(f" --logdir {root}"), printed
    port = free_port()
    command = [*shlex.split(printed), "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while RUN not in _get_or_none(f"{url}/data/runs"):
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "TensorBoard did not list the run within 60 s"
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _get_or_none(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()
    except OSError:
        return ""


def get(url: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_server_lists_one_run_per_training_run(tensorboard):
    assert get(f"{tensorboard}/data/runs") == [RUN]


def test_scalars_answer_is_it_learning_and_how_fast(tensorboard):
    tags = set(get(f"{tensorboard}/data/plugin/scalars/tags")[RUN])
    assert {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc"} <= tags
    assert {"workload/epoch", "workload/lr-Adam", "workload/samples_per_s", "workload/step_ms"} <= tags
    assert {f"val_per_class/acc_{k}" for k in range(10)} <= tags
    points = get(f"{tensorboard}/data/plugin/scalars/scalars?run={RUN}&tag=workload/samples_per_s")
    assert points and all(value > 0 for _wall_time, _step, value in points)


def test_the_dashboard_opens_on_the_loss_and_accuracy(tensorboard):
    """TensorBoard opens on its first plugin, Time Series, which shows the cards of every scalar and image tag
    sorted by TensorBoard's own order of names."""
    assert next(iter(get(f"{tensorboard}/data/plugins_listing"))) == "timeseries"
    cards = get(f"{tensorboard}/data/plugin/timeseries/tags")
    tags = [*cards["scalars"]["runTagInfo"][RUN], *cards["images"]["tagRunSampledInfo"]]
    first = sorted(tags, key=_tensorboards_order)[:6]
    assert first == ["test/acc", "test/loss", "train/acc", "train/loss", "val/acc", "val/loss"], first


def _tensorboards_order(tag: str) -> list[tuple[int, str]]:
    """The order of TensorBoard's `compareTagNames` (tensorboard/webapp/metrics/utils.ts) for the run's tags:
    character by character, a `/` before any other character, a shorter name before the longer it begins.
    (It also compares runs of digits as numbers, which these tags, with single-digit classes, do not need.)"""
    return [(0, "") if character == "/" else (1, character) for character in tag]


def test_images_show_confusion_matrices(tensorboard):
    tags = get(f"{tensorboard}/data/plugin/images/tags")[RUN]
    assert tags["visuals/val_confusion_matrix"]["samples"] == 1
    assert {"visuals/val_confusion_matrix", "visuals/test_confusion_matrix"} <= set(tags)
    (image,) = get(f"{tensorboard}/data/plugin/images/images?run={RUN}&tag=visuals/val_confusion_matrix")[-1:]
    png = urllib.request.urlopen(
        f"{tensorboard}/data/plugin/images/individualImage?{image['query']}", timeout=30
    ).read()
    assert png.startswith(b"\x89PNG")


def test_hparams_compare_runs_by_their_real_accuracy(tensorboard):
    experiment = get(f"{tensorboard}/data/plugin/hparams/experiment", {"experimentName": ""})
    names = {info["name"] for info in experiment["hparamInfos"]}
    assert {"model", "model/optimizer/lr", "data/dataset", "data/batch_size"} <= names
    assert {"trainer/max_epochs", "trainer/devices", "trainer/strategy", "seed_everything"} <= names
    assert {info["name"]["tag"] for info in experiment["metricInfos"]} == set(HPARAMS_METRICS)
    groups = get(
        f"{tensorboard}/data/plugin/hparams/session_groups",
        {"experimentName": "", "startIndex": 0, "sliceSize": 10, "colParams": [], "allowedStatuses": STATUSES},
    )["sessionGroups"]
    (group,) = groups
    assert group["hparams"]["model"] == "models.ConvNet"
    assert group["hparams"]["data/batch_size"] == 50
    metrics = {value["name"]["tag"]: value["value"] for value in group["metricValues"]}
    assert 0.85 <= metrics["test/acc"] < 1 and 0 < metrics["val/acc"] <= 1


def test_graph_is_there_when_asked_for(tensorboard):
    assert get(f"{tensorboard}/data/plugin/graphs/info")[RUN]["run_graph"] is True
