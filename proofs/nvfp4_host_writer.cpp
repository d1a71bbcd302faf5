// SPDX-License-Identifier: Apache-2.0
// The SM100 nvfp4_ds_mla writer's per-token arithmetic
// (vLLM 0.34.0 csrc/nvfp4_ds_mla_cache_kernels.cu,
// concat_and_cache_nvfp4_ds_mla_kernel), re-expressed on the host with
// NVIDIA's own conversion routines from cuda_fp8.h / cuda_fp4.h. On the host
// those headers emulate the device instructions the kernel uses
// (cvt.rn.satfinite.e4m3x2.f32 through __nv_fp8_e4m3(float), and
// cvt.rn.satfinite.e2m1x2.f32 through __nv_cvt_float2_to_fp4x2).
//
// stdin:  N tokens of 576 little-endian uint16 bf16 bit patterns
//         (512 kv_c values, then 64 k_pe values)
// stdout: N records of 352 bytes
// Build:  g++ -O1 -ffp-contract=off -I$CUDA_HOME/include nvfp4_host_writer.cpp
#include <cuda_fp4.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

static float bf16_bits_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

static int sf_byte(int s) { return 8 * (s & 3) + (s >> 2); }

int main() {
  uint16_t in[576];
  uint8_t rec[352];
  while (std::fread(in, sizeof(uint16_t), 576, stdin) == 576) {
    std::memset(rec, 0, sizeof(rec));
    for (int tile = 0; tile < 32; ++tile) {
      float vals[16];
      for (int i = 0; i < 16; ++i) {
        vals[i] = bf16_bits_to_float(in[tile * 16 + i]);
      }
      // nvfp4_tile_scale(vals, 6.0f, ...)
      float amax = 0.0f;
      for (int i = 0; i < 16; ++i) {
        amax = fmaxf(amax, fabsf(vals[i]));
      }
      const float sf_f = fmaxf(amax / 6.0f, 0.001953125f);
      const __nv_fp8_e4m3 sf8(sf_f);
      rec[320 + sf_byte(tile)] = *reinterpret_cast<const uint8_t*>(&sf8);
      const float sf = float(sf8);
      const float inv_sf = 1.0f / sf;
      // nvfp4_pack16_e2m1_rn: pair i -> byte i, element 2i in the low nibble.
      for (int i = 0; i < 8; ++i) {
        const __nv_fp4x2_storage_t packed = __nv_cvt_float2_to_fp4x2(
            make_float2(vals[2 * i] * inv_sf, vals[2 * i + 1] * inv_sf),
            __NV_E2M1, cudaRoundNearest);
        rec[tile * 8 + i] = static_cast<uint8_t>(packed);
      }
    }
    for (int i = 0; i < 64; ++i) {
      const __nv_fp8_e4m3 v8(bf16_bits_to_float(in[512 + i]));
      rec[256 + i] = *reinterpret_cast<const uint8_t*>(&v8);
    }
    std::fwrite(rec, 1, sizeof(rec), stdout);
  }
  return 0;
}
