"""The bandwidth floor of a super-op: its bytes moved at the GPU's peak memory bandwidth.

floor = (bytes read + bytes written, from the op's cost model) / peak HBM bandwidth. The peak is the
larger of the data-sheet figure for the device name and the one computed from the device properties
(2 × memory clock × bus width: double data rate), so the floor is never above what the memory can do;
a timed kernel faster than it did not move its bytes and is rejected. On a CPU nothing is timed.
"""

from __future__ import annotations

import torch

# data-sheet HBM bandwidth, bytes/s, by a substring of torch.cuda.get_device_name
DATASHEET = {"H200": 4.8e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12, "GH200": 4.9e12, "B200": 8.0e12,
             "B100": 8.0e12, "A100-SXM4-80GB": 2.039e12, "A100 80GB": 2.039e12, "A100": 1.555e12, "L40S": 0.864e12, "MI300X": 5.3e12}


def peak_bandwidth(device) -> tuple[float, str]:
    """(bytes/s, where the figure comes from) for a CUDA device; (inf, "cpu: untimed") otherwise."""
    device = torch.device(device)
    if device.type != "cuda":
        return float("inf"), "cpu: untimed"
    name = torch.cuda.get_device_name(device)
    sheet = next((bw for key, bw in DATASHEET.items() if key in name), 0.0)
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    computed = 2.0 * clock_khz * 1e3 * bus_bits / 8
    if max(sheet, computed) <= 0:
        return 20e12, f"{name}: unknown, assumed 20 TB/s (above any GPU made)"
    source = f"{name}: " + ("data sheet" if sheet >= computed else "2 x memory clock x bus width")
    return max(sheet, computed), source


def floor_seconds(bytes_moved: int, peak: float) -> float:
    return bytes_moved / peak
