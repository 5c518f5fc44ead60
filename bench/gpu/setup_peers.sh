#!/usr/bin/env bash
# On the benchmark's GPU machine only: install the peers and their requirements from wheels in .whl/ (no network
# there), ahead of the machine's own packages: torchtitan 0.2.2 (0.3.0 needs a newer torch than 2.11: it imports
# torch.distributed.fsdp.DataParallelMeshDims), torchtune 0.6.1, torchao 0.18 (0.17 when 0.18's float8 does not import
# with the machine's torch), transformers 5.23 (bigtrain's floor), datasets 4.7. torchtune 0.6.1 imports torchao APIs
# that 0.18 removed (TensorCoreTiledLayout), so torchao 0.12 goes to /tmp/site_torchtune, which peers.py puts first
# on the path of the torchtune runs only. Source it: `. bench/gpu/setup_peers.sh`.
# The wheels (fetched where pip reaches PyPI; .whl/ is ignored by git):
#   d="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform any --platform manylinux_2_28_x86_64"
#   pip download $d -d .whl torchtitan==0.2.2 torchtune==0.6.1 torchao==0.18.0 torchdata==0.11.0 tyro docstring-parser \
#     typeguard omegaconf "datasets==4.7.0" "dill==0.4.0" "multiprocess==0.70.18" transformers==5.23.0
#   pip download $d -d .whl/alt torchao==0.17.0; pip download $d -d .whl/tune torchao==0.12.0
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if ! python3 -c "from torchao.float8 import convert_to_float8_training" 2>/dev/null; then
  echo "torchao 0.18's float8 does not import here; using 0.17"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/alt/torchao-0.17*.whl || return 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site_torchtune .whl/tune/*.whl \
  || return 1
python3 -c "import torch, transformers, torchao; print('torch', torch.__version__, 'transformers', transformers.__version__, 'torchao', torchao.__version__, torch.cuda.get_device_name())"
