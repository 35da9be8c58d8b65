"""Loaded by every Python process of tests/run's ASan steps (this folder is put first on
PYTHONPATH there). Those processes start with LD_PRELOAD naming gcc's ASan runtime, which
Python needs before it can load build-asan's library. Child processes inherit it; that is
wanted for Python children (the chaos brokers load the library too) and wrong for every
other program: tests/pg, pg_ctl and the PostgreSQL server it restarts, and shell tools
would all run under AddressSanitizer and fail on their own leaks. So the preload is kept
only for children that are Python interpreters."""

import os
import re
import subprocess
import sys

_PYTHON = re.compile(r"python3(\.\d+)?$")


def _is_python(program) -> bool:
    if isinstance(program, bytes):
        program = program.decode(errors="replace")
    program = str(program)
    return program == sys.executable or bool(_PYTHON.search(os.path.basename(program)))


if os.environ.get("LD_PRELOAD"):
    _original_init = subprocess.Popen.__init__

    def _init(self, args, *rest, **kw):
        shell = kw.get("shell", False)
        if isinstance(args, (str, bytes)) or shell:
            program = kw.get("executable") or ("/bin/sh" if shell else args)
        else:
            args = list(args)
            program = kw.get("executable") or (args[0] if args else "")
        if not _is_python(program):
            env = dict(kw["env"] if kw.get("env") is not None else os.environ)
            env.pop("LD_PRELOAD", None)
            kw["env"] = env
        _original_init(self, args, *rest, **kw)

    subprocess.Popen.__init__ = _init

# This file shadows the distribution's sitecustomize; run that one too.
_system = os.path.join(sys.prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                       "sitecustomize.py")
if os.path.exists(_system):
    with open(_system, encoding="utf-8") as _f:
        exec(compile(_f.read(), _system, "exec"))
