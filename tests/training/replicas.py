"""Run a trainer module's entry point, as a launcher runs it, and save each rank's trainable weights when
training ends, for the data-parallel tests (tests/training/test_data_parallel.py).

    [accelerate launch ...] tests/training/replicas.py SAVE_DIR draftwheel.training.MODULE key=value ...

writes SAVE_DIR/rank-<process index>.safetensors: under data parallelism every rank must end with the same
weights (its gradients all-reduced every step), and rank 0's are the candidate it saved.
"""

from __future__ import annotations

import importlib
import sys

from safetensors.torch import save_file
from transformers import Trainer


def main(argv: list[str]) -> int:
    save_dir, module, *overrides = argv
    train = Trainer.train

    def train_and_save(self, *args, **kwargs):
        result = train(self, *args, **kwargs)
        weights = {name: param.detach().cpu().contiguous() for name, param in self.model.named_parameters()
                   if param.requires_grad}
        save_file(weights, f"{save_dir}/rank-{self.args.process_index}.safetensors")
        return result

    Trainer.train = train_and_save
    return importlib.import_module(module).main(overrides)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
