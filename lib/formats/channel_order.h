// formats/channel_order.h (internal): the channel order of decoded arrays ("npy" fields)
// for formats that keep them as fields (the tar-shard manifest records it). The words
// go into DatasetInfo::extra["channel_order"] as the LMDB and HDF5 readers put them
// ("decoded arrays: bgr (...; not converted)"), which convert's --encode check, the
// HDF5 and LMDB writers and the loader read; the source option `<format>.channels`
// says or converts the order, as lmdb.channels and hdf5.channels do.
#pragma once

#include <memory>
#include <string>

#include "formats/registry.h"
#include "shardkit/dataset.h"

namespace shardkit::formats {

// Sets info->extra["channel_order"] and ["channel_option"] from what the dataset records
// (`recorded`: "bgr", "rgb" or "" unknown, found in `where`) and the source option
// `option` (e.g. "wds.channels": bgr | rgb | bgr-to-rgb) in `opts`. Returns whether
// the arrays are to be converted from BGR to RGB on read (WithBgrToRgb), or
// kInvalidArgument for another option value.
Result<bool> ApplyChannelOrder(const std::string& recorded, const std::string& where, const std::string& option,
                               const OpenOptions& opts, DatasetInfo* info);

// `ds` with channels 0 and 2 of every H x W x 3|4 "npy" field swapped as it is read
// (sequential and random access). Same threading and lifetime rules as `ds`.
std::unique_ptr<Dataset> WithBgrToRgb(std::unique_ptr<Dataset> ds, DatasetInfo info);

// The reader option every format that reads decoded arrays declares: "<format>.channels"
// (bgr | rgb | bgr-to-rgb; default: the order the dataset records).
OptionSpec ChannelsReadOption();

// What a consumer for which the order matters (--encode, the loader, a writer that
// records an order for arrays it is not told about) reads from info.extra["channel_order"]:
// kRgb (RGB, said or converted), kBgr (BGR, not converted), kNone (2-D arrays only) or
// kUnknown (the dataset records no order: a colour array is refused, UnknownOrderMessage).
enum class ArrayOrder { kUnknown, kRgb, kBgr, kNone };
ArrayOrder ArrayOrderOf(const DatasetInfo& info);

// The source option that says or converts the order: info.extra["channel_option"], else
// "<format>.channels" (every format reads one).
std::string ChannelOption(const DatasetInfo& info);

// The refusal of a colour array whose order the source does not record, for `use`
// ("--encode png", "the loader", "an HDF5 output"): names the option that says it.
std::string UnknownOrderMessage(const DatasetInfo& info, const std::string& use);

// kInvalidArgument naming the sample when its "npy" field holds an H x W x 3|4 array:
// `message` (UnknownOrderMessage). Other samples and 2-D / 1-channel arrays pass.
Status RefuseColourArrays(const Sample& s, const std::string& message);

}  // namespace shardkit::formats
