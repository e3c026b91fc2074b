"""Where and with what a result was measured: GPU, driver, CUDA, torch, clocks."""

from __future__ import annotations

import datetime as _dt
import platform
import socket
import subprocess


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _nvidia_smi(fields: str, index: int) -> list[str] | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", f"--id={index}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return [v.strip() for v in out.split(",")] if out else None


class _Nvml:
    """NVML through ctypes (the driver's libnvidia-ml), initialised once per process: no
    process start and no re-initialisation per query, unlike ``nvidia-smi``."""

    lib = None
    failed = False

    @classmethod
    def get(cls):
        if cls.lib is None and not cls.failed:
            try:
                import ctypes

                lib = ctypes.CDLL("libnvidia-ml.so.1")
                if lib.nvmlInit_v2() != 0:
                    raise OSError("nvmlInit failed")
                cls.lib = lib
            except (OSError, AttributeError):
                cls.failed = True
        return cls.lib


def _nvml_clocks(device: str) -> dict | None:
    """Clocks of a CUDA device by its UUID (CUDA_VISIBLE_DEVICES may renumber devices)."""
    import ctypes

    import torch

    lib = _Nvml.get()
    if lib is None or not torch.cuda.is_initialized():
        return None
    index = int(device.split(":")[1]) if ":" in device else 0
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    handle = ctypes.c_void_p()
    if uuid is None or lib.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}".encode(), ctypes.byref(handle)) != 0:
        return None
    sm, mem, temp, power, pstate = (ctypes.c_uint() for _ in range(5))
    ok = (
        lib.nvmlDeviceGetClockInfo(handle, 1, ctypes.byref(sm)) == 0  # NVML_CLOCK_SM
        and lib.nvmlDeviceGetClockInfo(handle, 2, ctypes.byref(mem)) == 0  # NVML_CLOCK_MEM
    )
    if not ok:
        return None
    out = {"sm_mhz": str(sm.value), "mem_mhz": str(mem.value)}
    if lib.nvmlDeviceGetTemperature(handle, 0, ctypes.byref(temp)) == 0:  # NVML_TEMPERATURE_GPU
        out["temp_c"] = str(temp.value)
    if lib.nvmlDeviceGetPowerUsage(handle, ctypes.byref(power)) == 0:  # milliwatts
        out["power_w"] = f"{power.value / 1000:.2f}"
    if lib.nvmlDeviceGetPerformanceState(handle, ctypes.byref(pstate)) == 0:
        out["pstate"] = f"P{pstate.value}"
    return out


def clocks(device: str) -> dict | None:
    """SM and memory clocks (MHz), temperature, power and P-state of a CUDA device, or None.

    Read in-process through NVML (call it inside the GPU lock: NVML queries are calls into the
    GPU's resource manager, which serialises them with every other process's); ``nvidia-smi``
    where NVML cannot be loaded.
    """
    if not device.startswith("cuda"):
        return None
    try:
        got = _nvml_clocks(device)
    except Exception:  # noqa: BLE001 - provenance is best effort
        got = None
    if got:
        return got
    index = int(device.split(":")[1]) if ":" in device else 0
    vals = _nvidia_smi("clocks.sm,clocks.mem,temperature.gpu,power.draw,pstate", index)
    if not vals or len(vals) < 5:
        return None
    keys = ("sm_mhz", "mem_mhz", "temp_c", "power_w", "pstate")
    return dict(zip(keys, vals, strict=False))


def driver_version(proc_file: str = "/proc/driver/nvidia/version") -> str | None:
    """The NVIDIA kernel driver's version, from /proc (no call into the driver)."""
    import re

    try:
        text = open(proc_file).read()
    except OSError:
        return None
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+([0-9][0-9.]+)", text)
    return m.group(1) if m else None


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The host CPU's model name (host-bound calls time it as much as the GPU)."""
    try:
        for line in open(cpuinfo):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment(device: str) -> dict:
    """Static facts about the software and the device used."""
    import torch

    info = {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": device,
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
    }
    # Only where CUDA already runs (started inside the GPU lock): asking would otherwise start
    # the driver here, outside it.
    if device.startswith("cuda") and torch.cuda.is_initialized():
        index = int(device.split(":")[1]) if ":" in device else 0
        props = torch.cuda.get_device_properties(index)
        info["gpu"] = props.name
        # the machine a result was timed on: one GPU's UUID (a host name may be reused)
        info["gpu_uuid"] = str(getattr(props, "uuid", "")) or None
        info["sm_count"] = props.multi_processor_count
        info["capability"] = f"{props.major}.{props.minor}"
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["driver"] = driver_version()
        if info["driver"] is None:
            smi = _nvidia_smi("driver_version", index)
            info["driver"] = smi[0] if smi else None
    else:
        info["gpu"] = None
        info["driver"] = None
        info["cpu"] = platform.processor() or platform.machine()
    return info
