#!/usr/bin/env bash
# Here (the build machine): bundle the built gpu_* test binaries with the shared libraries
# the GPU machine (Ubuntu 24.04, CUDA 13) may lack, into DEST (default .dev/gpu of the
# checkout that the device tool sends), ready for: cd .dev/gpu && bash gpu-run.sh
# Run `make gpu` first. CUDA's own libraries are not copied (the machine has them).
# Also bundled: build/m3 (the GPU build) for tests/gpu_model.c, which reads the tiny
# fixtures of the checkout the bundle travels in (bash gpu-model-run.sh runs it first, then
# the kernel tests). FIXTURES=1 copies them into the bundle too.
set -euo pipefail
dest=${1:-.dev/gpu}
rm -rf "$dest"; mkdir -p "$dest/bin" "$dest/lib"
cp build/tests/gpu_* build/m3 "$dest/bin/"
cp scripts/device/gpu-run.sh scripts/device/gpu-model-run.sh scripts/bench-gpu.sh \
   scripts/bench_torch.py "$dest/"
if [ "${FIXTURES:-0}" = 1 ]; then
  mkdir -p "$dest/fixtures"
  cp -r fixtures/tiny-moe fixtures/tiny-deep "$dest/fixtures/"
fi
for b in "$dest"/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux|libstdc\+\+|libgcc_s)[.-]' \
  | grep -Ev 'cuda|cublas|cudart' | while read -r l; do cp -L "$l" "$dest/lib/"; done
# the device tool carries at most 64 MiB: strip the binaries, compress the libraries
strip --strip-debug "$dest"/bin/*
ls "$dest/lib"
tar -C "$dest" -cJf "$dest/lib.tar.xz" lib && rm -rf "$dest/lib"
# one large xz dictionary: the binaries share most of their bytes (the same device code),
# which a dictionary larger than one binary stores once (~200 MB of binaries -> ~4 MB)
tar -C "$dest" -cf - bin | xz -6 --lzma2=dict=256MiB > "$dest/bin.tar.xz" && rm -rf "$dest/bin"
du -sh "$dest"
