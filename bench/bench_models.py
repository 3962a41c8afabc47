"""Whole networks side by side with PyTorch: see :mod:`convengine.bench.modelbench`.

    python bench/bench_models.py --models resnet50,mobilenet_v2 --batch 1,8 \\
        --formats cl,nchw --modes infer,fused,train,int8,numpy --json out.json
"""

from convengine.bench.modelbench import main

if __name__ == "__main__":
    main()
