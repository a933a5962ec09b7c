/* processors_internal.h — what the Qwen2-VL image and video processors share (not public API). */
#ifndef MMC_PROCESSORS_INTERNAL_H
#define MMC_PROCESSORS_INTERNAL_H

#include "mmc_io.h"
#include "mmc_vlproc.h"

/* Rescale + normalise of one uint8 value, tabulated: lut[c][u] is the float32 value HF computes
 * for byte u of channel c. MMC_VLPROC_RESIZE_TORCH (the torchvision backend, and every video):
 * TorchvisionBackend.rescale_and_normalize, mean and std scaled by 1/rescale_factor in float32,
 * then (u - mean') / std'. Otherwise the PIL backend: u * rescale_factor in double, then
 * (x - mean) / std in float32. */
void mmc_qwen2vl_pixel_lut(const mmc_qwen2vl_proc *p, mmc_vlproc_resize_mode mode, float lut[3][256]);

/* "image_mean" / "image_std" of the processor config object o into mean / std where present (each a list of
 * exactly 3 numbers, else an error naming path, where — e.g. "video_processor." — and the key); absent keys
 * keep what mean / std hold. */
mmc_status mmc_vlproc_read_mean_std(const mmc_json *o, const char *path, const char *where, float mean[3],
                                    float std[3]);

#endif
