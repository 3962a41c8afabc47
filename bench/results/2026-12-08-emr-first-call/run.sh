#!/bin/bash
# Fresh venv (/tmp/wv) with the wheel built after `convengine build-cache --target
# x86-64-v4-vnni --onnx <the four models>` (build.sh), every cache empty per
# measurement (--fresh), 2 threads, new HOME. shipped: default; control:
# CONVENGINE_SHIPPED=0 (the same wheel compiling).
PY=/tmp/wv/bin/python
B=/work/main/bench/first_call.py
M=/tmp/abm/resnet50.onnx,/tmp/abm/mobilenet_v2.onnx,/tmp/abm/resnet50/int8.onnx,/tmp/abm/mobilenet_v2/int8.onnx
export HOME=/tmp/newhome
mkdir -p $HOME
for r in 1 2 3; do
  echo "# round $r shipped, suites"; $PY $B --fresh
  echo "# round $r shipped, tuning cache-only, suites"; CONVENGINE_TUNING=cache-only $PY $B --fresh
  echo "# round $r shipped, onnx"; $PY $B --fresh --onnx $M
done
echo "# control (CONVENGINE_SHIPPED=0), suites"; CONVENGINE_SHIPPED=0 $PY $B --fresh
