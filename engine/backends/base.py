"""What a backend can run: one :class:`ModeSupport` per registered mode.

Every backend publishes a :class:`BackendCapabilities` so that the profiler can say
which modes it skipped and why, routers can map modes the backend lacks to their
nearest substitute, and profiles record the reference mode and its precision
explicitly (FP16 on GPUs; a CPU backend's native precision, fp32).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.modes import get_mode, list_modes


@dataclass(frozen=True)
class ModeSupport:
    mode: str
    supported: bool
    how: str = ""
    reason: str = ""

    def __post_init__(self):
        if self.supported and not self.how:
            raise ValueError(f"{self.mode}: a supported mode must say how it is implemented")
        if not self.supported and not self.reason:
            raise ValueError(f"{self.mode}: an unsupported mode must say why")


@dataclass(frozen=True)
class BackendCapabilities:
    backend: str
    reference_mode: str
    reference_precision: str
    modes: dict[str, ModeSupport] = field(default_factory=dict)

    def __post_init__(self):
        get_mode(self.reference_mode)
        for name in self.modes:
            get_mode(name)
        if not self.support(self.reference_mode).supported:
            raise ValueError(f"{self.backend}: the reference mode must be supported")

    def support(self, mode: str) -> ModeSupport:
        get_mode(mode)
        return self.modes.get(
            mode, ModeSupport(mode, False, reason=f"{self.backend} does not implement {mode}")
        )

    def supported_modes(self) -> list[str]:
        """Supported modes in registry order."""
        return [m.name for m in list_modes() if self.support(m.name).supported]

    def unsupported(self) -> dict[str, str]:
        return {m.name: self.support(m.name).reason for m in list_modes()
                if not self.support(m.name).supported}
