/* fuzz_image.c — libFuzzer target for image decoding (mmc_image_load_memory): JPEG through
 * libjpeg-turbo and PNG through libpng with our error handling around them, the EXIF
 * orientation parser (TIFF IFDs from JPEG APP1 and PNG eXIf chunks) and the conversions
 * to RGB (grey, palette, alpha, 16-bit, CMYK). Images are capped at 2^20 pixels so that
 * a header claiming a huge size is refused instead of exhausting memory. */
#include "mmc_image.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mmc_image_opts o;
    mmc_image_opts_default(&o);
    o.max_pixels = 1 << 20;
    /* the first byte picks the alpha rule, so every conversion path is reachable */
    if (size > 0) {
        o.alpha = (mmc_alpha_mode)(data[0] % 2);
        o.exif_transpose = (data[0] & 2) == 0;
    }
    mmc_image img = {0};
    if (mmc_image_load_memory(data, size, "fuzz", &o, &img) == MMC_OK) {
        /* a decoded image is whole: touch every byte */
        volatile uint8_t acc = 0;
        for (size_t i = 0; i < (size_t)img.height * img.width * 3; i++) acc ^= img.data[i];
        (void)acc;
        mmc_image_free(&img);
    }
    return 0;
}
