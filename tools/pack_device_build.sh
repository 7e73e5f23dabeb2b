#!/usr/bin/env bash
# Packs the CUDA build for the device machine (the device tool's `run` with carry=["build-dev"]; its 64 MiB carry
# limit is why the binaries travel stripped and xz-compressed, through python's lzma on both ends since the device
# machine has no guarantee of an xz binary: about half of gzip's size, which leaves room for same-call A/B binaries): build-dev/ gets kb_nano, tests/kbn_gpu_tests and the shared
# libraries kb_nano loads from build/lib (cpp-httplib, brotli: without them it does not start there), plus
# build-dev/unpack.sh, which the device command runs first to put them back under build/.
# Usage, from the repo root after `cmake --build build`:  tools/pack_device_build.sh
# Then on the device:  build-dev/unpack.sh && export LD_LIBRARY_PATH=$PWD/build/lib:$LD_LIBRARY_PATH && ...
set -euo pipefail
cd "$(dirname "$0")/.."
for f in build/kb_nano build/tests/kbn_gpu_tests; do
  [ -x "$f" ] || { echo "pack_device_build: $f is missing: build the CUDA tree first (cmake --build build)" >&2; exit 2; }
done
rm -rf build-dev
mkdir -p build-dev/lib
xz_py() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(open(sys.argv[1],'rb'), lzma.open(sys.argv[2],'wb'))" "$@"; }
strip -o build-dev/kb_nano build/kb_nano
strip -o build-dev/kbn_gpu_tests build/tests/kbn_gpu_tests
for f in kb_nano kbn_gpu_tests; do xz_py build-dev/$f build-dev/$f.xz && rm build-dev/$f; done
# Each shared library once, under its SONAME (the name the loader looks for), not once per symlink.
for f in build/lib/*.so*; do
  [ -e "$f" ] || continue
  so=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
  [ -n "$so" ] && [ ! -e "build-dev/lib/$so" ] && cp -L "$f" "build-dev/lib/$so"
done
cat >build-dev/unpack.sh <<'UNPACK'
#!/usr/bin/env bash
# Puts the carried binaries back under build/ (kb_nano, tests/kbn_gpu_tests, lib/).
set -e
mkdir -p build/tests build/lib
unxz_py() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$@"; }
unxz_py build-dev/kb_nano.xz build/kb_nano
unxz_py build-dev/kbn_gpu_tests.xz build/tests/kbn_gpu_tests
chmod +x build/kb_nano build/tests/kbn_gpu_tests
cp -L build-dev/lib/* build/lib/ 2>/dev/null || true
UNPACK
chmod +x build-dev/unpack.sh
echo "pack_device_build: build-dev/ is $(du -sh build-dev | cut -f1) (the carry limit is 64 MiB)"
