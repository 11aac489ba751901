"""The ``edgefuse`` command run as a user runs it: a file of models to name, and the runs in new processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SVG = "{http://www.w3.org/2000/svg}"

MODELS_PY = textwrap.dedent(
    '''
    import torch
    from torch import nn


    class Norm(nn.Module):
        """Hugging Face Llama's RMSNorm."""

        def __init__(self, width):
            super().__init__()
            self.weight = nn.Parameter(1 + 0.1 * torch.randn(width))

        def forward(self, x):
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * h.to(x.dtype)


    class Block(nn.Module):
        def __init__(self, width=32):
            super().__init__()
            self.norm = Norm(width)
            self.linear = nn.Linear(width, width, bias=False)

        def forward(self, x):
            return x + self.linear(self.norm(x))


    def block():
        torch.manual_seed(0)
        return Block(), (torch.randn(1, 8, 32),)


    def raises():
        raise RuntimeError("the checkpoint is not here")


    def data_dependent():
        class M(nn.Module):
            def forward(self, x):
                if x.sum() > 0:
                    return x
                return -x

        return M(), (torch.randn(3),)


    def wrong_inputs():
        torch.manual_seed(0)
        return Block(), (torch.randn(1, 8, 16),)


    class WithIndex(nn.Module):
        """A norm and an integer output: which feature of each row is largest."""

        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(x), x.argmax(-1)


    def integer_output():
        torch.manual_seed(0)
        return WithIndex(), (torch.randn(1, 8, 32),)


    class Inverse(nn.Module):
        """A norm, then a matrix inverse: torch.export takes it, ExecuTorch's core ATen opset does not."""

        def __init__(self):
            super().__init__()
            self.norm = Norm(4)

        def forward(self, x):
            return torch.linalg.inv(self.norm(x))


    def not_in_edge():
        torch.manual_seed(0)
        return Inverse(), (torch.randn(4, 4),)


    class Branches(nn.Module):
        """A norm in a branch of torch.cond, which export traces by re-importing this file's module."""

        def __init__(self):
            super().__init__()
            self.norm = Norm(32)

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: self.norm(x), lambda x: x * 2, (x,))


    def with_cond():
        torch.manual_seed(0)
        return Branches(), (torch.randn(1, 8, 32),)


    class WritesItsInput(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            x.mul_(2.0)
            return self.block(x) + x


    class CountsCalls(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.register_buffer("calls", torch.zeros(32))

        def forward(self, x):
            self.calls.add_(1.0)
            return self.block(x + self.calls)


    def stateful():
        torch.manual_seed(0)
        return WritesItsInput(), (torch.randn(1, 8, 32),)


    def counter():
        torch.manual_seed(0)
        return CountsCalls(), (torch.randn(1, 8, 32),)


    class ReturnsItsBuffer(CountsCalls):
        def forward(self, x):
            return super().forward(x), self.calls


    class WritesAWeight(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            y = self.block(x)
            with torch.no_grad():
                self.block.linear.weight.mul_(0.5)
            return y


    def returns_buffer():
        torch.manual_seed(0)
        return ReturnsItsBuffer(), (torch.randn(1, 8, 32),)


    def writes_weight():
        torch.manual_seed(0)
        return WritesAWeight(), (torch.randn(1, 8, 32),)


    class MaskedLogits(nn.Module):
        """A norm, then logits with the positions past each row's length masked to -inf."""

        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            keep = torch.arange(x.shape[1]).unsqueeze(-1) < 5
            return self.block(x).masked_fill(~keep, float("-inf"))


    def masked():
        torch.manual_seed(0)
        return MaskedLogits(), (torch.randn(1, 8, 32),)


    class Rank7Norm(nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


    def rank7():
        return Rank7Norm(), (torch.randn(1, 2, 1, 2, 1, 2, 16),)


    class NormThenLogsumexp(nn.Module):
        """A float16 norm, then logsumexp, which to_edge decomposes into float16 steps that round."""

        def __init__(self):
            super().__init__()
            self.norm = Norm(64)

        def forward(self, x):
            return torch.logsumexp(self.norm(x) * 3, -1)


    def logsumexp():
        torch.manual_seed(0)
        return NormThenLogsumexp().half(), (torch.randn(4, 8, 64, dtype=torch.float16) * 3,)


    def torch_norm():
        torch.manual_seed(0)
        return nn.Sequential(nn.RMSNorm(32, eps=1e-6), nn.Linear(32, 32)), (torch.randn(1, 8, 32),)


    class TorchNormInCond(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.inner = nn.RMSNorm(32, eps=1e-6), nn.RMSNorm(32, eps=1e-6)

        def forward(self, x):
            y = self.first(x)
            return torch.cond(y.sum() > 0, lambda y: self.inner(y), lambda y: y * 2, (y,))


    def torch_norm_in_cond():
        torch.manual_seed(0)
        return TorchNormInCond(), (torch.randn(1, 8, 32),)


    def on_meta():
        with torch.device("meta"):
            return Block(), (torch.randn(1, 8, 32),)
    '''
)


def run(*args: str, cwd) -> subprocess.CompletedProcess:
    """``python -m edgefuse -q ARGS`` in ``cwd``; stdout and stderr as text."""
    return subprocess.run(
        [sys.executable, "-m", "edgefuse", "-q", *args],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )


#: Runs ``edgefuse.cli.main`` on each argv in the JSON list ``sys.argv[1]`` in this one process (torch and
#: ExecuTorch are imported once, by the first command), with file descriptors 1 and 2 sent to a file per
#: command, so what torch's loggers and native code print is caught with the rest; writes
#: ``[{code, stdout, stderr}]`` to ``sys.argv[2]``.
COMMANDS = textwrap.dedent(
    """
    import json, os, sys, tempfile
    from edgefuse import cli

    results = []
    for argv in json.loads(sys.argv[1]):
        files = {fd: tempfile.TemporaryFile("w+") for fd in (1, 2)}
        sys.stdout.flush(), sys.stderr.flush()
        saved = {fd: os.dup(fd) for fd in files}
        for fd, f in files.items():
            os.dup2(f.fileno(), fd)
        try:
            code = cli.main(["-q", *argv])
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
        text = {}
        for fd, f in files.items():
            f.seek(0)
            text[fd] = f.read()
        results.append({"code": code, "stdout": text[1], "stderr": text[2]})
    with open(sys.argv[2], "w") as out:
        json.dump(results, out)
    """
)


def run_commands(*argvs: list[str], cwd) -> list[dict]:
    """Each ``edgefuse -q ARGV`` of ``argvs`` in one new process (see COMMANDS): exit code, stdout, stderr."""
    results = cwd / "results.json"
    done = subprocess.run(
        [sys.executable, "-c", COMMANDS, json.dumps(argvs), str(results)],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(results.read_text())


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
