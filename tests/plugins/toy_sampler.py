"""A plug-in sampler in one file (the example of docs/extending.md): ``eval.sampler=toy_hf`` with
``plugins=[tests.plugins.toy_sampler]``. It samples as the transformers sampler does, a few prompts per call: its
one key ``eval.toy_hf.max_batch`` (declared below, default 2; a sampler's options are the subtree ``eval.<name>``)
caps the prompts of one ``generate`` call. Each call is logged to the file named by the environment variable
``TOY_SAMPLER_LOG`` (when set), so a test can tell that this sampler ran and honoured its key.
"""
import os

from core.config_keys import I
from core.sampling import HFSampler, register_sampler


@register_sampler("toy_hf", missing=lambda: None, auto_rank=lambda: None)
class ToyHF(HFSampler):
    """The transformers sampler under another name, with a batch cap of its own."""

    name = "toy_hf"
    CONFIG = {"eval.toy_hf.max_batch": I(1, default=2, doc="prompts per generate call")}

    @classmethod
    def from_path(cls, model_path, options):
        smp = super().from_path(model_path, options)
        smp.max_batch = int(options.engine.get("max_batch", cls.CONFIG["eval.toy_hf.max_batch"].default))
        return smp

    def sample(self, prompts, n, seeds, settings, **kw):
        out = []
        for a in range(0, len(prompts), self.max_batch):
            if os.environ.get("TOY_SAMPLER_LOG"):
                with open(os.environ["TOY_SAMPLER_LOG"], "a") as fh:
                    fh.write(f"{len(prompts[a:a + self.max_batch])}\n")
            part = slice(a, a + self.max_batch)
            own = {**kw, "prefixes": kw["prefixes"][part]} if kw.get("prefixes") else kw
            out += super().sample(prompts[part], n, seeds[part], settings, **own)
        return out
