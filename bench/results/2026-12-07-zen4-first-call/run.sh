#!/bin/bash
# Fresh venv with the wheel (built with `convengine build-cache --target x86-64-v4-vnni
# --onnx <the four models>`), every cache empty per measurement (--fresh), 2 threads.
# shipped: default; control: CONVENGINE_SHIPPED=0 (the same wheel compiling as before).
R=$(dirname "$0")
PY=/tmp/wv/bin/python
B=/work/main/bench/first_call.py
M=/tmp/onnx/resnet50.onnx,/tmp/onnx/mobilenet_v2.onnx,/tmp/onnx/resnet50_qdq.onnx,/tmp/onnx/mobilenet_v2_qdq.onnx
export HOME=/tmp/newhome
for r in 1 2 3; do
  echo "# round $r shipped, suites"; $PY $B --fresh
  echo "# round $r shipped, tuning cache-only, suites"; CONVENGINE_TUNING=cache-only $PY $B --fresh
  echo "# round $r shipped, onnx"; $PY $B --fresh --onnx $M
done
echo "# control (CONVENGINE_SHIPPED=0), suites"; CONVENGINE_SHIPPED=0 $PY $B --fresh
echo "# control (CONVENGINE_SHIPPED=0), onnx mobilenet_v2 fp32"; CONVENGINE_SHIPPED=0 $PY $B --fresh --onnx /tmp/onnx/mobilenet_v2.onnx
