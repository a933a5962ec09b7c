/* flux_pipeline_internal.h — the FluxPipeline's state, shared by flux_pipeline.c (loading,
 * denoising, decoding) and flux_prompt.c (the text encoders). */
#ifndef MMC_FLUX_PIPELINE_INTERNAL_H
#define MMC_FLUX_PIPELINE_INTERNAL_H

#include "mmc_diffusion.h"

struct mmc_flux_pipeline {
    mmc_diffusers_dir dir;
    mmc_vae_config vae_cfg;
    mmc_flux_config tr_cfg;
    mmc_fm_scheduler sched;
    mmc_flux *transformer;          /* loaded by the first sample() */
    mmc_vae *vae;                   /* loaded by the first decode() */
    char comp_dir[8][1024];         /* component folders: see enum below */
    struct mmc_lora_set *lora;      /* an adapter on the transformer (mmc_flux_pipeline_load_lora) */
    bool borrowed;                  /* the transformer belongs to the caller (a training run) */
};
enum { C_TRANSFORMER, C_VAE, C_SCHEDULER, C_TEXT, C_TOK, C_TEXT2, C_TOK2 };


#endif
