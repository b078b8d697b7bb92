"""Two JAX processes on this CPU joined by jax.distributed on localhost.

Each process has 2 CPU devices; together they form one 4-device mesh. A
global array is built from each process's rows and summed across the mesh;
the reference is the sum worked out here with numpy.
"""

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORKER = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", 2)
    port, pid = sys.argv[1], int(sys.argv[2])
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2,
                               process_id=pid)
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from paraagent_jax import sharding as shd
    mesh = shd.make_mesh({"data": 2, "fsdp": 2})
    local = np.arange(4 * 3, dtype=np.float32).reshape(4, 3) + 100 * pid
    x = jax.make_array_from_process_local_data(
        NamedSharding(mesh, P(("data", "fsdp"))), local)
    total = jax.jit(lambda a: (a * a).sum(),
                    out_shardings=NamedSharding(mesh, P()))(x)
    print("RESULT", jax.process_count(), len(jax.devices()), float(total),
          flush=True)
""")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_process_cpu_mesh_sums_global_array():
  port = _free_port()
  env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
  procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(port), str(i)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=ROOT) for i in range(2)]
  outs = []
  for p in procs:
    try:
      outs.append(p.communicate(timeout=120)[0])
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
  rows = np.concatenate([np.arange(12, dtype=np.float64).reshape(4, 3) + 100 * i
                         for i in range(2)])
  want = float((rows * rows).sum())
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-2000:]
    line = [l for l in out.splitlines() if l.startswith("RESULT")][-1].split()
    assert line[1:3] == ["2", "4"], line
    np.testing.assert_allclose(float(line[3]), want, rtol=1e-6)
