"""Which model a chapter loads: the shipped default offline and on the CPU, a bigger one on a GPU with a network,
and COURSE_MODEL over both."""
from __future__ import annotations

import socket

import pytest
import torch

from course_lib import chapter
from course_lib.chapter import GPU_MODEL, chapter_model, hub_reachable, setup_chapter

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture
def online(monkeypatch):
    monkeypatch.delenv("COURSE_MODEL", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(chapter, "hub_reachable", lambda: True)


def test_cpu_keeps_the_default_model_even_online(online):
    assert chapter_model(CPU, GPU_MODEL) is None


def test_cuda_with_a_network_takes_the_chapters_gpu_model(online):
    assert chapter_model(CUDA, GPU_MODEL) == GPU_MODEL
    assert chapter_model(CUDA, None) is None  # a chapter that asks for nothing keeps the default


def test_cuda_offline_keeps_the_default_model(online, monkeypatch):
    monkeypatch.setattr(chapter, "hub_reachable", lambda: False)
    assert chapter_model(CUDA, GPU_MODEL) is None


@pytest.mark.parametrize("device", [CPU, CUDA])
def test_course_model_wins_everywhere(online, monkeypatch, device):
    monkeypatch.setenv("COURSE_MODEL", "Qwen/Qwen2.5-1.5B-Instruct")
    assert chapter_model(device, GPU_MODEL) == "Qwen/Qwen2.5-1.5B-Instruct"
    monkeypatch.setenv("COURSE_MODEL", "default")
    assert chapter_model(device, GPU_MODEL) is None


def test_hub_reachable_respects_offline_mode_and_a_failed_connection(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_reachable() is False
    monkeypatch.delenv("HF_HUB_OFFLINE")

    def refuse(*args, **kwargs):
        raise OSError("network unreachable")
    monkeypatch.setattr(socket, "create_connection", refuse)
    assert hub_reachable() is False


def test_setup_chapter_prints_the_model_only_when_it_is_not_the_default(online, monkeypatch, capsys):
    setup = setup_chapter(device="cpu", dtype="float32", gpu_model=GPU_MODEL)
    assert setup.model is None and "Model:" not in capsys.readouterr().out
    monkeypatch.setenv("COURSE_MODEL", "/models/tiny")
    setup = setup_chapter(device="cpu", dtype="float32", gpu_model=GPU_MODEL)
    out = capsys.readouterr().out.splitlines()
    assert setup.model == "/models/tiny" and out[0].startswith("Machine:") and out[1].startswith("Model: /models/tiny")
