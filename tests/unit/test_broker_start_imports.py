"""What a broker process imports before it serves: kio without hypothesis (and so
without trio, pytest, attrs), which a dev venv has installed; hypothesis stays
importable afterwards in the same process."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

PROBE = """
import sys
import tidewater.broker.__main__ as main
main.import_kafka_types_without_hypothesis()
import tidewater.broker.process
from kio.static.primitive import i32
assert i32(5) == 5
loaded = sorted({name.split(".")[0] for name in sys.modules}
                & {"hypothesis", "trio", "pytest", "_pytest", "attr", "pygments"})
print("loaded:", ",".join(loaded))
import hypothesis.strategies
print("hypothesis importable:", hypothesis.strategies.integers is not None)
"""


def test_the_broker_imports_kio_without_hypothesis_and_hypothesis_stays_importable():
    pytest.importorskip("hypothesis")  # the case this guards: a venv with hypothesis
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=100)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["loaded: ", "hypothesis importable: True"]


def test_hypothesis_already_loaded_is_left_alone():
    pytest.importorskip("hypothesis")
    probe = ("import sys, hypothesis.strategies\n"
             "import tidewater.broker.__main__ as main\n"
             "main.import_kafka_types_without_hypothesis()\n"
             "import kio.static._phantom as p\n"
             "print(p.hypothesis is not None)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=100)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
