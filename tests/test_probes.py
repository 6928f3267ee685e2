"""Probes against fakes of pynvml and torch.cuda: these pass without a GPU. The GPU script runs the real ones."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from adaptive_gate.memory import MemorySample
from adaptive_gate.probes import CombinedProbe, NvmlProbe, ProbeUnavailable, TorchCudaProbe, auto_probe, device_label

GiB = 2**30
DRIVER_RESERVED_BYTES = 300 * 2**20


class FakeNvml(types.ModuleType):
    """Two cards in PCI order; memory info v2 optional; records how devices were looked up."""

    class NVMLError(Exception):
        pass

    nvmlMemory_v2 = 0x02000028

    def __init__(self, *, v2: bool = True, init_error: bool = False) -> None:
        super().__init__("pynvml")
        self.v2 = v2
        self.init_error = init_error
        self.lookups: list[tuple[str, Any]] = []
        self.cards = [
            {"uuid": "GPU-aaaa", "pci": "00000000:01:00.0", "name": "Slow Card", "used": 1 * GiB, "total": 16 * GiB},
            {"uuid": "GPU-bbbb", "pci": "00000000:41:00.0", "name": "Fast Card", "used": 5 * GiB, "total": 80 * GiB},
        ]

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        self.lookups.append(("index", index))
        return self.cards[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> dict[str, Any]:
        self.lookups.append(("uuid", uuid))
        for card in self.cards:
            if card["uuid"] == uuid:
                return card
        raise self.NVMLError("Not Found")

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> dict[str, Any]:
        self.lookups.append(("pci", bus_id))
        return next(card for card in self.cards if card["pci"] == bus_id)

    def nvmlDeviceGetName(self, handle: dict[str, Any]) -> bytes:
        return str(handle["name"]).encode()

    def nvmlDeviceGetUUID(self, handle: dict[str, Any]) -> str:
        return str(handle["uuid"])

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any], version: int | None = None) -> Any:
        """v1: `used` includes the driver's reserve; v2 reports the reserve apart (as real drivers do)."""
        if version is not None and not self.v2:
            raise self.NVMLError("Function Not Found")
        info = types.SimpleNamespace(used=handle["used"], total=handle["total"], free=handle["total"] - handle["used"])
        if version is not None:
            info.reserved = DRIVER_RESERVED_BYTES
            info.used = handle["used"] - DRIVER_RESERVED_BYTES
        return info

    def nvmlDeviceGetComputeRunningProcesses(self, handle: dict[str, Any]) -> list[object]:
        return [object(), object()]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """torch.cuda on a machine with one visible card (the fast one, CUDA's device 0)."""
    state: dict[str, Any] = {"free": 60 * GiB, "total": 80 * GiB, "allocated": 10 * GiB, "reserved": 14 * GiB}
    state["ooms"] = 3
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state["free"], state["total"]))
    monkeypatch.setattr(
        torch.cuda,
        "memory_stats",
        lambda device=None: {
            "allocated_bytes.all.current": state["allocated"],
            "reserved_bytes.all.current": state["reserved"],
            "num_ooms": state["ooms"],
        },
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(uuid="bbbb"))
    return state


def test_torch_reads_free_memory_only_once_the_app_holds_some_on_the_device(
    fake_cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mem_get_info` creates a CUDA context on a device that has none: the probe does not, from its thread,
    before the app's allocator holds memory there; then it reads on, whatever the allocator holds."""
    asked: list[object] = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: asked.append(device) or (60 * GiB, 80 * GiB))
    fake_cuda["allocated"] = fake_cuda["reserved"] = 0
    probe = TorchCudaProbe(0)
    with pytest.raises(ProbeUnavailable, match="no CUDA context of this process on cuda:0 yet"):
        probe.sample()
    assert asked == []
    contexts = {0: True}  # torch's CUDA builds say whether one exists (ONNX Runtime's, say): then it is read
    monkeypatch.setattr(torch._C, "_cuda_hasPrimaryContext", contexts.__getitem__, raising=False)
    assert TorchCudaProbe(0).sample().total_bytes == 80 * GiB and asked == [0]
    contexts[0] = False
    with pytest.raises(ProbeUnavailable):
        probe.sample()
    monkeypatch.delattr(torch._C, "_cuda_hasPrimaryContext")
    asked.clear()
    fake_cuda["allocated"] = fake_cuda["reserved"] = 2 * GiB  # the app put its model there
    assert probe.sample().used_bytes == 20 * GiB and asked == [0]
    fake_cuda["allocated"] = fake_cuda["reserved"] = 0  # emptied its cache: the context stays
    assert probe.sample().total_bytes == 80 * GiB and asked == [0, 0]


def test_torch_probes_read_the_card_within_the_share_the_app_capped_pytorch_at(
    nvml: FakeNvml, fake_cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`set_per_process_memory_fraction(0.5)` on the 80 GiB card: PyTorch refuses past 40 GiB, where NVML and
    `mem_get_info` show the whole card. The room is what is left under the cap beside the allocator's tensors,
    and on the card beside everything: a neighbour that leaves less than that is the others' bytes."""
    fraction = {0: 0.5}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: fraction[device])
    torch_probe = TorchCudaProbe(0)
    combined = CombinedProbe(NvmlProbe(1), torch_probe)
    # 10 GiB in tensors, 4 more cached: 30 GiB of room under the cap, 64 on the card
    assert torch_probe.sample().total_bytes == 40 * GiB and torch_probe.sample().used_bytes == 10 * GiB
    nvml.cards[1]["used"] = 74 * GiB  # a neighbour: 10 GiB left on the card (4 of them our cache)
    assert combined.sample().total_bytes == 40 * GiB and combined.sample().used_bytes == 30 * GiB
    fraction[0] = 1.0  # no cap: the whole card
    assert torch_probe.sample().total_bytes == 80 * GiB and combined.sample().used_bytes == 70 * GiB


def test_nvml_by_index_uuid_and_pci(nvml: FakeNvml) -> None:
    assert NvmlProbe(0).sample() == MemorySample(1 * GiB, 16 * GiB, process_count=2)
    assert NvmlProbe("GPU-bbbb").sample().total_bytes == 80 * GiB
    assert NvmlProbe("bbbb").sample().total_bytes == 80 * GiB  # torch's bare UUID
    assert NvmlProbe("00000000:41:00.0").sample().total_bytes == 80 * GiB
    assert ("uuid", "GPU-bbbb") in nvml.lookups and ("pci", "00000000:41:00.0") in nvml.lookups


def test_nvml_reads_v2_and_falls_back_to_v1(nvml: FakeNvml) -> None:
    probe = NvmlProbe(0)
    # v2's used leaves out the driver's reserve, which total includes: added back, both agree
    assert probe.memory_info() == (1 * GiB, 16 * GiB, DRIVER_RESERVED_BYTES)
    nvml.v2 = False
    assert probe.memory_info() == (1 * GiB, 16 * GiB, None)
    assert probe.process_count() == 2


def test_nvml_missing_or_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(ProbeUnavailable, match="nvidia-ml-py is not installed"):
        NvmlProbe(0)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error=True))
    with pytest.raises(ProbeUnavailable, match="Library Not Found"):
        NvmlProbe(0)


def test_torch_probe_does_not_count_the_allocator_cache(fake_cuda: dict[str, Any]) -> None:
    sample = TorchCudaProbe(0).sample()
    # 20 GiB used on the card, of which 4 GiB is PyTorch's cache (reserved - allocated): 16 GiB really taken.
    assert sample == MemorySample(16 * GiB, 80 * GiB, 3, allocated_bytes=10 * GiB, reserved_bytes=14 * GiB)


def test_torch_probe_needs_cuda() -> None:
    if torch.cuda.is_available():  # pragma: no cover - this suite runs on CPU machines
        pytest.fail("this test expects a CPU-only torch")
    with pytest.raises(ProbeUnavailable, match="is_available"):
        TorchCudaProbe(0)


def test_combined_probe(nvml: FakeNvml, fake_cuda: dict[str, Any]) -> None:
    probe = CombinedProbe(NvmlProbe("GPU-bbbb"), TorchCudaProbe(0))
    # 5 GiB on NVML minus the 4 GiB cache
    expected = MemorySample(1 * GiB, 80 * GiB, 3, allocated_bytes=10 * GiB, reserved_bytes=14 * GiB, process_count=2)
    assert probe.sample() == expected


def test_device_labels_for_metrics(nvml: FakeNvml, fake_cuda: dict[str, Any]) -> None:
    """The UUID where NVML gives one, so a series follows the card, not its index."""
    assert device_label(NvmlProbe(1)) == "GPU-bbbb"
    assert device_label(CombinedProbe(NvmlProbe("GPU-aaaa"), TorchCudaProbe(0))) == "GPU-aaaa"
    assert device_label(TorchCudaProbe(0)) == "cuda:0"
    assert device_label(None) == "none"
    assert device_label(types.SimpleNamespace(sample=lambda: None)) == "SimpleNamespace"
    assert device_label(types.SimpleNamespace(sample=lambda: None, device_label="sim-7")) == "sim-7"


def test_nvml_reads_the_process_list_now_and_then(nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(nvml, "nvmlDeviceGetComputeRunningProcesses", lambda handle: calls.append(1) or [1, 2, 3])
    probe = NvmlProbe(0)
    assert [probe.sample().process_count for _ in range(50)] == [3] * 50
    assert len(calls) == 1  # milliseconds a call: not on every sample

    def unsupported(handle: object) -> list[object]:
        raise nvml.NVMLError("Not Supported")

    monkeypatch.setattr(nvml, "nvmlDeviceGetComputeRunningProcesses", unsupported)
    probe = NvmlProbe(0)
    assert probe.sample().process_count is None


def test_auto_maps_cuda_to_nvml_by_uuid_never_by_index(
    nvml: FakeNvml, fake_cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # CUDA's device 0 is NVML's device 1
    probe, line = auto_probe()
    assert isinstance(probe, CombinedProbe) and "Fast Card" in line
    assert nvml.lookups == [("uuid", "GPU-bbbb")]
    assert probe.sample().total_bytes == 80 * GiB


def test_auto_without_torch_uses_a_uuid_from_cuda_visible_devices(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb,GPU-aaaa")
    probe, line = auto_probe()
    assert isinstance(probe, NvmlProbe) and probe.uuid == "GPU-bbbb"
    assert "torch not imported" in line


@pytest.mark.parametrize(
    ("visible", "order", "expected"),
    [
        ("GPU-bbbb,GPU-aaaa", None, "GPU-aaaa"),  # the second entry names CUDA's device 1
        ("MIG-aaaa,GPU-aaaa", None, "GPU-aaaa"),
        ("1,0", "PCI_BUS_ID", "GPU-aaaa"),  # CUDA's device 1 is NVML's index 0
        ("5,0,-1,1", "PCI_BUS_ID", "GPU-aaaa"),  # "-1" hides the rest: device 1 is the "0"
    ],
)
def test_auto_without_torch_maps_any_cuda_device_through_cuda_visible_devices(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, visible: str, order: str | None, expected: str
) -> None:
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    if order is None:
        monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    else:
        monkeypatch.setenv("CUDA_DEVICE_ORDER", order)
    probe, _ = auto_probe(cuda_device=1)
    assert isinstance(probe, NvmlProbe) and probe.uuid == expected


@pytest.mark.parametrize("visible", ["", "-1", "GPU-bbbb", "0,,1"])
def test_auto_without_torch_refuses_a_device_cuda_does_not_see(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch, visible: str
) -> None:
    """Where CUDA_VISIBLE_DEVICES shows CUDA no device 1, no card is read in its place."""
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    probe, line = auto_probe(cuda_device=1)
    assert probe is None and "shows CUDA no device 1" in line
    assert nvml.lookups == []


def test_auto_with_nothing_runs_without_a_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    probe, line = auto_probe()
    assert probe is None
    assert "OOM and latency signals" in line and "nvidia-ml-py is not installed" in line


def test_auto_falls_back_to_torch(monkeypatch: pytest.MonkeyPatch, fake_cuda: dict[str, Any]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(init_error=True))
    probe, line = auto_probe()
    assert isinstance(probe, TorchCudaProbe) and "NVML unavailable" in line


def test_nvml_finds_a_mig_instance_by_the_bare_uuid_torch_gives(nvml: FakeNvml) -> None:
    nvml.cards.append({"uuid": "MIG-cccc", "pci": "00000000:41:00.0", "name": "Slice", "used": GiB, "total": 10 * GiB})
    assert NvmlProbe("cccc").uuid == "MIG-cccc"
    assert nvml.lookups[-2:] == [("uuid", "GPU-cccc"), ("uuid", "MIG-cccc")]
    with pytest.raises(FakeNvml.NVMLError, match="Not Found"):
        NvmlProbe("dddd")


def test_nvml_refuses_a_card_in_mig_mode_and_reads_its_instance(
    nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A card in MIG mode shows every instance's memory (60 of 80 GiB here, where this process's slice holds
    10): read by index, the gate would take the others' slices for pressure on its own."""
    nvml.cards[0].update(used=60 * GiB, total=80 * GiB)
    nvml.cards.append({"uuid": "MIG-cccc", "pci": "00000000:01:00.0", "name": "Slice", "used": GiB, "total": 10 * GiB})

    def mig_mode(handle: dict[str, Any]) -> tuple[int, int]:
        # An instance's handle may answer its card's mode: it is told apart by nvmlDeviceIsMigDeviceHandle
        return (1, 1) if handle["uuid"] in ("GPU-aaaa", "MIG-cccc") else (0, 0)

    monkeypatch.setattr(nvml, "nvmlDeviceGetMigMode", mig_mode, raising=False)
    monkeypatch.setattr(
        nvml, "nvmlDeviceIsMigDeviceHandle", lambda handle: handle["uuid"].startswith("MIG-"), raising=False
    )
    with pytest.raises(ProbeUnavailable, match="MIG mode.*CUDA_VISIBLE_DEVICES=MIG-"):
        NvmlProbe(0)
    assert NvmlProbe(1).sample().total_bytes == 80 * GiB  # MIG off: the whole card
    assert NvmlProbe("MIG-cccc").sample().total_bytes == 10 * GiB
    monkeypatch.delitem(sys.modules, "torch")
    probe, line = auto_probe()
    assert probe is None and "MIG mode" in line


def test_torch_probes_can_leave_the_oom_count_out(nvml: FakeNvml, fake_cuda: dict[str, Any]) -> None:
    """cuDNN's self-caught OOMs raise num_ooms on requests that succeed: an app that swallows no OOM opts out."""
    assert TorchCudaProbe(0).sample().oom_count == 3
    assert TorchCudaProbe(0, count_ooms=False).sample().oom_count is None
    assert CombinedProbe(NvmlProbe(1), TorchCudaProbe(0, count_ooms=False)).sample().oom_count is None
    probe, _ = auto_probe(count_ooms=False)
    assert isinstance(probe, CombinedProbe) and probe.sample().oom_count is None
