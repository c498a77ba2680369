"""GPU checks: skipped on machines without CUDA."""
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO
from tests.prewarmed import python


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_vllm_sampler_smoke_script():
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[gpu]')")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_smoke_vllm.py")], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0 and "gpu_smoke_vllm: OK" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.slow
def test_gpu_eval_check_script_runs_its_whole_path_on_the_cpu(tmp_path):
    """scripts/gpu_check_eval.py --device cpu: the device machine's script (no MLflow, no Hydra) on the CPU, so
    it cannot rot where no GPU is lent; the same checks, float32."""
    proc = subprocess.run([*python(), str(REPO / "scripts" / "gpu_check_eval.py"), "--device", "cpu", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "gpu_check_eval: OK" in proc.stdout, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert '"sampler": "hf"' in proc.stdout and '"entropy_rows_compared": 0' not in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_eval_check_script():
    proc = subprocess.run([*python(), str(REPO / "scripts" / "gpu_check_eval.py")], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0 and "gpu_check_eval: OK" in proc.stdout, (proc.stdout[-3000:], proc.stderr[-3000:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_verl_engine_two_quatro_steps_then_evaluation():
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[verl]')")
    pytest.importorskip("transfer_queue", reason="verl's full dependencies are not installed (pip install -e '.[verl]')")
    proc = subprocess.run([*python(), str(REPO / "scripts" / "gpu_check_verl.py")], capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0 and "gpu_check_verl: OK" in proc.stdout, (proc.stdout[-3000:], proc.stderr[-3000:])
