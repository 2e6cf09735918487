"""docs/design/architecture.md names every module of broker/ and controller/ in its
file-by-file tables, so the layout a newcomer reads cannot drift from the code."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "design" / "architecture.md"


def modules(package: str) -> list[str]:
    """Each module's path below ``package`` (``replicas/hw_checkpoint.py``); generated
    Kafka schema modules are named by their folder (``kafka/schemas/``)."""
    base = ROOT / package
    found = []
    for path in sorted(base.rglob("*.py")):
        relative = path.relative_to(base).as_posix()
        if path.name == "__init__.py" or "__pycache__" in relative:
            continue
        if relative.startswith("kafka/schemas/"):
            relative = "kafka/schemas/"
        found.append(relative)
    return sorted(set(found))


def test_every_broker_and_controller_module_is_named_in_the_architecture_doc():
    text = DOC.read_text(encoding="utf-8")
    missing = [f"{package}/{module}" for package in ("broker", "controller")
               for module in modules(package)
               if module not in text and Path(module).name not in text]
    assert not missing, f"not named in {DOC.relative_to(ROOT)}: {missing}"
