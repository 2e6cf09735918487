"""``make fuzz``: every target in tests/fuzz/targets.py under atheris for a bounded time.

    cd tests && python -m fuzz.run [--seconds 60] [--target NAME ...]

Each target runs in its own process (libFuzzer stops a process at its first
crash) for ``--seconds``, seeded with ``tests/fuzz/corpus/<target>/`` and
growing a scratch corpus under ``build/fuzz/``. A crash, a hang (10 s on one
input) or memory above 2 GiB is saved into ``tests/fuzz/corpus/<target>/`` as
``crash-*`` / ``timeout-*`` / ``oom-*``: from then on tests/unit/
test_fuzz_regressions.py replays it on every ``make test``, so it fails until the
parser is fixed. Exits 1 if any target found something.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parents[1]
PROJECT_DIR = TESTS_DIR.parent
CORPUS_DIR = TESTS_DIR / "fuzz" / "corpus"
SCRATCH_DIR = PROJECT_DIR / "build" / "fuzz"


def fuzz_one(name: str) -> None:
    """In a child process: run libFuzzer on target ``name`` (arguments after ``--``)."""
    import atheris

    with atheris.instrument_imports(include=["tidewater"]):
        from fuzz import targets

    def test_one_input(data: bytes) -> None:
        targets.run_one(name, data)

    atheris.Setup([sys.argv[0], *sys.argv[sys.argv.index("--") + 1:]], test_one_input)
    atheris.Fuzz()


def main(argv: list[str] | None = None) -> int:
    from fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=60, help="per target")
    parser.add_argument("--target", action="append", choices=sorted(TARGETS))
    args = parser.parse_args(argv)
    found = []
    for name in args.target or sorted(TARGETS):
        seeds = CORPUS_DIR / name
        scratch = SCRATCH_DIR / name
        seeds.mkdir(parents=True, exist_ok=True)
        scratch.mkdir(parents=True, exist_ok=True)
        before = set(seeds.iterdir())
        command = [sys.executable, "-m", "fuzz.run", "--child", name, "--",
                   f"-max_total_time={args.seconds}", "-timeout=10", "-rss_limit_mb=2048",
                   f"-artifact_prefix={seeds}/", "-print_final_stats=1", str(scratch), str(seeds)]
        print(f"fuzz: {name} for {args.seconds} s", flush=True)
        result = subprocess.run(command, cwd=TESTS_DIR, capture_output=True, text=True)
        stats = [line for line in result.stderr.splitlines()
                 if line.startswith(("stat::number_of_executed_units", "stat::new_units_added"))]
        print("  " + "; ".join(stats), flush=True)
        saved = sorted(set(seeds.iterdir()) - before)
        if result.returncode != 0 or saved:
            found.append(name)
            print(f"  FOUND: exit {result.returncode}, saved {[p.name for p in saved]}",
                  flush=True)
            print("\n".join(result.stderr.splitlines()[-30:]), flush=True)
    print(f"fuzz: {'problems in ' + ', '.join(found) if found else 'nothing found'}")
    return 1 if found else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        fuzz_one(sys.argv[2])
    else:
        sys.exit(main())
