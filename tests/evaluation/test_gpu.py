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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_verl_engine_two_quatro_steps_then_evaluation():
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[verl]')")
    pytest.importorskip("transfer_queue", reason="verl's full dependencies are not installed (pip install -e '.[verl]')")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check_verl.py")], capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0 and "gpu_check_verl: OK" in proc.stdout, (proc.stdout[-3000:], proc.stderr[-3000:])
