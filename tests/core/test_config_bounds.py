"""Numbers in the config that would freeze or spin the daemon stop `llmmon serve` at start-up.

YAML yields `.inf`, `.nan` and negatives without complaint; an interval of `.inf` used to kill
the collector's thread, `.nan` spun a core and answered 500 at /api/v1/collectors, and
`max_ranks: .inf` ended in a traceback.  Each is refused with exit status 2 and one line
naming the key, also when a flag overrides the file's value.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from llmmon.options import Option


def serve_with(config: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llmmon", "serve", f"--config.file={config}",
                           "--web.listen-address=127.0.0.1:1", *flags],
                          capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("yaml_text, message", [
    ("collectors: {disk: {interval: .inf}}",
     "collectors.disk.interval: not a finite duration: inf"),
    ("collectors: {disk: {interval: .nan}}",
     "collectors.disk.interval: not a finite duration: nan"),
    ("collectors: {disk: {interval: 0.000001}}",
     "collectors.disk.interval: 1e-06 is out of range: use 100ms to 24h"),
    ("collectors: {ranks: {max_ranks: .inf}}",
     "collectors.ranks.max_ranks: not an integer: inf"),
    ("collectors: {ranks: {max_ranks: -1}}",
     "collectors.ranks.max_ranks: -1 is out of range: use 1 to 10000"),
    ("collectors: {ranks: {max_ranks: 2.5}}",
     "collectors.ranks.max_ranks: not an integer: 2.5"),
    ("collectors: {gpu: {power_sample_rate: 1e9}}",
     "collectors.gpu.power_sample_rate: '1e9' is out of range: use 1.0 to 200.0"),
    ("collectors: {gpu: {peak_flops_dtypes: [bf16, fp61]}}",
     "collectors.gpu.peak_flops_dtypes: unknown value(s) 'fp61': use bf16, fp16, fp8, tf32"),
    ("sampler: {max_staleness: -5}",
     "sampler.max_staleness: duration must be positive: -5"),
])
def test_non_finite_negative_and_absurd_values_stop_serve_naming_the_key(
        tmp_path: Path, yaml_text: str, message: str) -> None:
    config = tmp_path / "llmmon.yaml"
    config.write_text(yaml_text + "\n")
    result = serve_with(config)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"llmmon serve: {message}\n"


def test_a_bad_file_value_is_refused_even_when_a_flag_overrides_it(tmp_path: Path) -> None:
    config = tmp_path / "llmmon.yaml"
    config.write_text("collectors: {disk: {interval: .inf}}\n")
    result = serve_with(config, "--collector.disk.interval=5s")
    assert result.returncode == 2, result.stderr
    assert result.stderr == "llmmon serve: collectors.disk.interval: not a finite duration: inf\n"


def test_a_numeric_option_declares_its_range_and_a_default_inside_it() -> None:
    with pytest.raises(ValueError, match="declares its minimum and maximum"):
        Option("every", "duration", "5s", "An option without bounds.")
    with pytest.raises(ValueError, match="out of range"):
        Option("every", "duration", "5s", "A default outside its bounds.",
               minimum="10s", maximum="1m")
