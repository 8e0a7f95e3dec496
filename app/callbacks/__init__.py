"""Callbacks: behaviours no library has, each one public object whose constructor is its interface."""
