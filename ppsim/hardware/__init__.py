"""Device and link presets."""

from ppsim.hardware.presets import DEVICES, LINKS, DeviceSpec, LinkSpec, resolve_device, resolve_link

__all__ = ["DEVICES", "LINKS", "DeviceSpec", "LinkSpec", "resolve_device", "resolve_link"]
