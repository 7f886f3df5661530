// vqddp: the whole library in one include.
//
//   #include <vqddp/vqddp.h>      (pkg-config --cflags vqddp)
//
// engine/  tensors, autograd, ops, layers, optimizers, devices, safetensors
// comm/    communicators (single, in-process thread ranks, NCCL, MPI), launch
// vq/      quantizers behind one contract (vq/quantizer.h) and their parts
// train/   config, schedule, model, DDP wrapper, checkpoints, trainer
// data/    WAV and IDX readers and the data sets built on them
//
// Every installed header is included here (tests/install_package.sh checks
// it), so a program that includes only this file sees the whole API.
#pragma once

// engine/
#include "engine/autograd.h"
#include "engine/core/config_reader.h"
#include "engine/conv_plan.h"
#include "engine/core/count_limits.h"
#include "engine/device.h"
#include "engine/device_counters.h"
#include "engine/core/dtype.h"
#include "engine/core/error.h"
#include "engine/exact_batch.h"
#include "engine/core/file_io.h"
#include "engine/core/json_strict.h"
#include "engine/kernel_math.h"
#include "engine/nn.h"
#include "engine/nn_conv.h"
#include "engine/ops.h"
#include "engine/optim.h"
#include "engine/core/output_file.h"
#include "engine/cpu/parallel.h"
#include "engine/step_graph.h"
#include "engine/core/parse_number.h"
#include "engine/core/random.h"
#include "engine/core/safetensors.h"
#include "engine/core/streams.h"
#include "engine/core/tensor.h"

// comm/
#include "comm/batch_reduce.h"
#include "comm/communicator.h"
#include "comm/dist_env.h"
#include "comm/errors.h"
#include "comm/fingerprint.h"
#include "comm/agree.h"
#include "comm/backends.h"
#include "comm/process_launcher.h"
#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/single.h"
#include "comm/store.h"
#include "comm/thread_group.h"

// vq/
#include "vq/assign.h"
#include "vq/beam_search.h"
#include "vq/directional_reparam.h"
#include "vq/code_logits.h"
#include "vq/code_stats.h"
#include "vq/codebook.h"
#include "vq/codebook_affine.h"
#include "vq/codebook_diversity.h"
#include "vq/codebook_layer.h"
#include "vq/codebook_loss_options.h"
#include "vq/device_constants.h"
#include "vq/fsp.h"
#include "vq/fsq.h"
#include "vq/gumbel_sample.h"
#include "vq/grouped.h"
#include "vq/in_place_codebook_step.h"
#include "vq/kmeans.h"
#include "vq/latent_quantize.h"
#include "vq/lfq.h"
#include "vq/losses.h"
#include "vq/orthogonal_reg.h"
#include "vq/perplexity.h"
#include "vq/quantize_dropout.h"
#include "vq/quantizer.h"
#include "vq/quantizer_kind.h"
#include "vq/quantizer_options.h"
#include "vq/random_projection.h"
#include "vq/residual_fsq.h"
#include "vq/residual_lfq.h"
#include "vq/residual_sim_vq.h"
#include "vq/residual_vq.h"
#include "vq/rotation_trick.h"
#include "vq/sampler.h"
#include "vq/sim_vq.h"
#include "vq/vector_quantize.h"

// train/
#include "train/checkpoint.h"
#include "train/codec.h"
#include "train/codec_stream.h"
#include "train/code_packets.h"
#include "train/codes_file.h"
#include "train/config.h"
#include "train/ddp.h"
#include "train/discriminators.h"
#include "train/gan.h"
#include "train/metrics_log.h"
#include "train/model.h"
#include "train/networks.h"
#include "train/run_identity.h"
#include "train/run_record.h"
#include "train/schedule.h"
#include "train/spectral.h"
#include "train/stoi.h"
#include "train/trainer.h"

// data/
#include "data/data_config.h"
#include "data/dataset.h"
#include "data/idx.h"
#include "data/audio.h"
#include "data/audio_windows.h"
#include "data/example_source.h"
