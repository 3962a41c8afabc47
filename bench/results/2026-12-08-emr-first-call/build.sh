#!/bin/bash
set -e
cd /work/main
. .venv/bin/activate
rm -rf src/convengine/_shipped
export CONVENGINE_CACHE_DIR=/tmp/emrwheel/bc-cache NUMBA_CACHE_DIR=/tmp/emrwheel/bc-numba
start=$(date +%s)
convengine build-cache --target x86-64-v4-vnni --onnx /tmp/abm/resnet50.onnx,/tmp/abm/mobilenet_v2.onnx,/tmp/abm/resnet50/int8.onnx,/tmp/abm/mobilenet_v2/int8.onnx
echo "build-cache took $(( $(date +%s) - start )) s"
du -sh src/convengine/_shipped; find src/convengine/_shipped -type f | wc -l
pip install -q build
rm -rf /tmp/emrwheel/dist
python -m build --wheel --outdir /tmp/emrwheel/dist . > /tmp/emrwheel/wheel.log 2>&1
ls -la /tmp/emrwheel/dist
rm -rf /tmp/wv && python3 -m venv /tmp/wv && /tmp/wv/bin/pip install -q /tmp/emrwheel/dist/*.whl
/tmp/wv/bin/pip list 2>/dev/null | grep -i -E "numba|numpy|llvmlite|convengine|scipy"
echo BUILD-DONE
