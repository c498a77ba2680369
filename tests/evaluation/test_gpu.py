"""GPU checks: skipped on machines without CUDA."""
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_vllm_sampler_smoke_script():
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[gpu]')")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_smoke_vllm.py")], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0 and "gpu_smoke_vllm: OK" in proc.stdout, proc.stderr[-3000:]
