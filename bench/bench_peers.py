"""convengine against ONNX Runtime, OpenVINO, PyTorch eager and ``torch.compile`` on
whole networks: see :mod:`convengine.bench.peers` (also ``convengine bench --peers``).

    python bench/bench_peers.py --json peers.json
    python bench/bench_peers.py --models mobilenet_v2 --batch 1 --engines onnxruntime,convengine
"""

import sys

from convengine.bench.peers import main

if __name__ == "__main__":
    sys.exit(main())
