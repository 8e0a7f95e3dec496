"""The README and docs/ pages: every relative link leads to a file that exists, every `#heading` to a heading of it,
and every `#L<n>` link to a line that holds the name the link shows, so that the pages stay true when code moves;
and the examples they show run as written."""

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image, ImageOps

from tests.helpers import run_command, run_in_process, run_job
from tests.synthetic import read_idx_images

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[([^\]]*)\]\(([^)#\s]+)(?:#([^)\s]+))?\)")


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown page."""
    headings = re.findall(r"(?m)^#+ (.+)$", page.read_text())
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_somewhere(page):
    for text, target, anchor in LINK.findall(page.read_text()):
        if "://" in target:
            continue
        path = (page.parent / target).resolve()
        assert path.exists(), f"{page.name}: [{text}]({target}) leads nowhere"
        if anchor and anchor.startswith("L") and anchor[1:].isdigit():
            lines = path.read_text().splitlines()
            line = lines[int(anchor[1:]) - 1] if int(anchor[1:]) <= len(lines) else ""
            assert text.strip("`") in line, f"{page.name}: [{text}]({target}#{anchor}) is not on that line"
        elif anchor:
            assert anchor in heading_anchors(path), f"{page.name}: {target}#{anchor} names no heading"


def test_the_readme_is_short():
    assert len((REPO / "README.md").read_text().splitlines()) < 150


def python_block(page: Path) -> str:
    (block,) = re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)
    return block


def test_the_onnxruntime_example_classifies_pictures_as_predict_does(checkpoint, data_dir, tmp_path):
    """docs/use-the-model.md: the example turns pictures into MNIST-like images as `predict` does, so both agree."""
    best, _ = checkpoint
    digits = read_idx_images(data_dir / "MNIST" / "raw" / "t10k-images-idx3-ubyte")[:12].copy()
    pictures = tmp_path / "pictures"
    pictures.mkdir()
    for index, digit in enumerate(digits):  # dark strokes on paper, larger, in colour, not square: as photographed
        paper = ImageOps.invert(Image.fromarray(digit)).resize((56, 84 if index % 2 else 56)).convert("RGB")
        paper.save(pictures / f"{index:02d}.png")
    (tmp_path / "classify.py").write_text(python_block(REPO / "docs" / "use-the-model.md"))
    shutil.copy(REPO / "datamodules" / "images.py", tmp_path / "images.py")  # as the page says
    assert (
        run_in_process(
            "export", "--ckpt_path", str(best), "--format", "onnx", "--output", str(tmp_path / "model.onnx")
        ).returncode
        == 0
    )
    files = sorted(str(path) for path in pictures.iterdir())
    example = subprocess.run(
        [sys.executable, "classify.py", "model.onnx", *files], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert example.returncode == 0, example.stderr
    output = tmp_path / "predictions.csv"
    argv = ("--ckpt_path", str(best), "--data.predict_dir", str(pictures), "--predictions.path", str(output))
    predicted = run_in_process("predict", *argv, "--trainer.accelerator", "cpu", "--trainer.logger", "false")
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    with output.open(newline="") as rows:
        expected = [f"{pictures / row['file']} {row['class_name']}" for row in csv.DictReader(rows)]
    assert example.stdout.splitlines() == expected


def test_the_offline_example_reads_the_four_files_where_the_readme_puts_them(data_dir, tmp_path):
    readme = (REPO / "README.md").read_text()
    offline = readme[readme.index("**Offline**") :]
    names = re.findall(r"`((?:train|t10k)-(?:images-idx3|labels-idx1)-ubyte)`", offline)
    folder = re.search(r"in\s+`(data/MNIST/raw/)`", offline).group(1)
    (command,) = re.findall(r"```bash\n\.venv/bin/python train\.py (.*)\n```", offline)
    assert len(set(names)) == 4
    (tmp_path / folder).mkdir(parents=True)
    for name in names:
        shutil.copy(data_dir / "MNIST" / "raw" / name, tmp_path / folder / name)
    quick = ("--trainer.max_epochs", "1", "--data.val_size", "200", "--trainer.enable_progress_bar", "false")
    result = run_command([sys.executable, str(REPO / "train.py"), *command.split(), *quick], 120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "runs" / "SeqNet-mnist" / "version_0" / "checkpoints" / "last.ckpt").is_file()


def test_the_global_batch_line_of_the_configuration_page_is_what_a_run_prints(data_dir, tmp_path):
    """docs/configuration.md shows the line a 2-process run with the defaults starts with (on MNIST's 55,000
    training images); the same run on the small test set prints it with its own number of steps."""
    (documented,) = re.findall(r"(?m)^Global batch .*$", (REPO / "docs" / "configuration.md").read_text())
    pattern = (
        re.escape(documented)
        .replace("4300", r"\d+")
        .replace("430", r"\d+")
        .replace(re.escape("steps per"), "steps? per")
    )
    result = run_job(
        2,
        *("fit", "--data.data_dir", str(data_dir), "--data.val_size", "200", "--devices", "2"),
        *("--trainer.accelerator", "cpu"),
        *("--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "0"),
        *("--trainer.default_root_dir", str(tmp_path)),
        folder=tmp_path / "logs",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(pattern, result.stdout + result.stderr), (documented, result.stderr[-2000:])


def test_the_usage_commands_run_as_printed_after_the_readme_set_up():
    """After the README's set-up, its Usage block starts by activating `.venv`: then `python train.py` and
    `tensorboard` are the set-up's (outside it, `python` may have no torch and `tensorboard` may not exist)."""
    readme = (REPO / "README.md").read_text()
    usage = readme[readme.index("## Usage") :]
    start = usage.index("```bash\n") + len("```bash\n")
    block = usage[start : usage.index("\n```", start)].splitlines()
    activate = block[0].split("#")[0].strip()
    assert activate == "source .venv/bin/activate"
    assert {line.split()[0] for line in block[1:]} == {"python", "tensorboard"}
    venv = REPO / ".venv"
    if Path(sys.prefix) != venv:
        pytest.skip(f"the tests run in {sys.prefix}, not in the README's {venv}")
    outside = ":".join(part for part in os.environ["PATH"].split(":") if not part.startswith(str(venv)))
    check = f"{activate} && command -v python tensorboard && python train.py fit --help > /dev/null"
    result = subprocess.run(
        ["bash", "-c", check],
        cwd=REPO,
        env={**os.environ, "PATH": outside},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    found = [Path(path).resolve() for path in result.stdout.splitlines()]
    assert found == [(venv / "bin" / "python").resolve(), (venv / "bin" / "tensorboard").resolve()]


def test_every_figure_of_the_readmes_results_comes_with_the_command_that_gave_it():
    """Each row: a command as printed (it parses, as is), its accuracy and its time; the machine is named above."""
    readme = (REPO / "README.md").read_text()
    results = readme[readme.index("## Results") : readme.index("## Layout")]
    assert "2-core development VM" in results
    rows = re.findall(r"^\| `(python train\.py[^`]*)`[^|]*\| (0\.\d{4}) \| (\d+) s \|$", results, re.MULTILINE)
    assert len(rows) == results.count("\n| `"), "a row without a command, an accuracy or a time"
    assert len(rows) >= 3
    for command, _accuracy, _seconds in rows:
        parsed = run_in_process(*command.split()[2:], "--print_config")
        assert parsed.returncode == 0, (command, parsed.stderr[-1000:])
