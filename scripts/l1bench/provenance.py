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


def clocks(device: str) -> dict | None:
    """SM and memory clocks (MHz), temperature and power of a CUDA device, or None."""
    if not device.startswith("cuda"):
        return None
    index = int(device.split(":")[1]) if ":" in device else 0
    vals = _nvidia_smi("clocks.sm,clocks.mem,temperature.gpu,power.draw,pstate", index)
    if not vals or len(vals) < 5:
        return None
    keys = ("sm_mhz", "mem_mhz", "temp_c", "power_w", "pstate")
    return dict(zip(keys, vals))


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
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        index = int(device.split(":")[1]) if ":" in device else 0
        props = torch.cuda.get_device_properties(index)
        info["gpu"] = props.name
        info["sm_count"] = props.multi_processor_count
        info["capability"] = f"{props.major}.{props.minor}"
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        smi = _nvidia_smi("driver_version", index)
        info["driver"] = smi[0] if smi else None
    else:
        info["gpu"] = None
        info["driver"] = None
        info["cpu"] = platform.processor() or platform.machine()
    return info
