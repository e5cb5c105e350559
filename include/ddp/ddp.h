/*
 * ddp/ddp.h — the whole public API of libddp. Include this one header.
 *
 * Conventions (README.md, "The library"; the status codes in ddp/status.h): calls return
 * ddp_status (DDP_OK = 0, errors negative); output arguments come last and are written only on
 * success; handles are opaque and their destroy/close accepts NULL; a handle is used from one
 * thread at a time unless its header says otherwise.
 */
#ifndef DDP_DDP_H
#define DDP_DDP_H

#include "ddp/amp.h"
#include "ddp/ckpt.h"
#include "ddp/config.h"
#include "ddp/data.h"
#include "ddp/device.h"
#include "ddp/errfile.h"
#include "ddp/group.h"
#include "ddp/model.h"
#include "ddp/nn.h"
#include "ddp/optim.h"
#include "ddp/reducer.h"
#include "ddp/sampler.h"
#include "ddp/spawn.h"
#include "ddp/status.h"
#include "ddp/store.h"
#include "ddp/tb.h"
#include "ddp/tensor.h"
#include "ddp/world.h"

#define DDP_VERSION_MAJOR 0
#define DDP_VERSION_MINOR 1
#define DDP_VERSION_PATCH 0
#define DDP_VERSION_STRING "0.1.0"

#endif /* DDP_DDP_H */
