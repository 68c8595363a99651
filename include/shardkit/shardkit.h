// shardkit/shardkit.h: the whole public API.
#pragma once

#include "shardkit/bench.h"
#include "shardkit/bytes.h"
#include "shardkit/convert.h"
#include "shardkit/dataset.h"
#include "shardkit/feed.h"
#include "shardkit/filesystem.h"
#include "shardkit/gpu.h"
#include "shardkit/index.h"
#include "shardkit/loader.h"
#include "shardkit/sample.h"
#include "shardkit/status.h"
#include "shardkit/verify.h"
#include "shardkit/version.h"
