// Internal: LMDB layouts written by other people's scripts ("in the wild"), read
// without a shardkit.json. docs/formats-lmdb.md shows the script behind each.
//
//  "image":  value = an image file's bytes (JPEG, PNG, WebP, BMP, GIF, TIFF).
//            Keys that are relative paths ("n01440764/x.JPEG") give the sample key
//            (path without extension), the field (the extension, or the sniffed
//            type) and the label (the parent folder, numbered in sorted order as
//            an image folder's classes). Keys that are plain indices ("0", "17")
//            give the sample key only.
//  "pickle": value = pickle.dumps((image, label)) where image is a decoded numpy
//            array (cv2.imread: uint8 [H, W, 3] in BGR order; field "npy") or the
//            image file's bytes (field by sniffed type), label an int (field "cls").
//            Read with the strict subset reader (core/pickle.h): nothing is run.
//
// In both, entries whose key starts and ends with "__" (`__keys__`, `__len__`)
// are metadata beside the samples, not samples; `__len__`, when present, must
// equal the number of samples. Keys that are all decimal integers are ordered
// numerically ("2" before "10"), as the scripts that wrote f"{idx}" meant.
//
// Thread safety: pure functions; a Catalog is immutable once built.
#pragma once

#include <cstdint>
#include <optional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/pickle.h"
#include "shardkit/sample.h"
#include "shardkit/status.h"

namespace shardkit::formats::lmdb::wild {

enum class Kind { kImage, kPickle };

std::string_view Name(Kind k);
// "image" / "pickle" -> Kind.
std::optional<Kind> Parse(std::string_view name);

// The layout the first sample value shows, if any.
std::optional<Kind> Detect(std::string_view value);

// A metadata entry beside the samples (`__keys__`, `__len__`).
bool IsSideEntry(std::string_view lkey);

// What the reader knows after one pass over the keys.
struct Catalog {
  Kind kind = Kind::kImage;
  std::vector<std::string> keys;         // LMDB keys of the samples, in dataset order
  bool numeric_keys = false;             // every key a decimal integer (ordered by value)
  std::vector<std::string> class_names;  // image layout with path keys: sorted parent folders
  // Pickled arrays of 3 or 4 channels (last dimension): the channel order they are said
  // to have (OpenOptions::format_options["lmdb.channels"]): "bgr" (default: what
  // cv2.imread gives; kept as is), "rgb" (kept as is), or "bgr-to-rgb" (channels 0 and
  // 2 swapped on read, so the arrays come out RGB).
  std::string channels = "bgr";
  // The first array is 2-D (or H x W x 1): grayscale, no channel order. Set only when
  // nothing says the order (no lmdb.channels, no shardkit.json); an array with 3 or 4
  // channels later is then refused (its order is unknown), never guessed.
  bool gray = false;
  // The split layouts of text-recognition LMDBs: CRNN's create_dataset.py
  // ("image-%09d" an image file, "label-%09d" its label text, "num-samples" the
  // count) and its kin (images under "image_N" or the bare index "N", labels under
  // "label_N" or "label-N", a count under "num_samples" or "__len__", or none).
  // `keys` are then the image keys in numeric order and label_keys[i] sample i's
  // label key; the sample key is the digits and the label comes as a "txt" field.
  // Empty otherwise.
  std::vector<std::string> label_keys;
};

// Whether `keys` (every key of the LMDB but side entries) are a split layout above:
// true when a "label-<digits>" or "label_<digits>" key is there with image keys
// ("image-<digits>", "image_<digits>" or "<digits>"), or when "num-samples" is there
// with "image-<digits>" keys. Every other key must then be an image or label key of
// that form or a count key of `counts`, each image must have its label and the other
// way round, and every value of `counts` (count key -> value: "num-samples",
// "num_samples", "__len__" as found) must count the images, or kCorrupt names the
// key. Fills *images and *labels in numeric order.
Result<bool> SplitLayout(const std::vector<std::string>& keys, const std::map<std::string, Bytes>& counts,
                         const std::string& where, std::vector<std::string>* images,
                         std::vector<std::string>* labels);

// Whether a pickled value's image (an array, or the first item of (array, label)) has
// no channel order: 2-D, or a last dimension of 1. False when it is not such a pickle.
bool IsGrayArray(std::string_view value);

// Orders `keys` (side entries already removed) and fills the catalog's keys,
// numeric_keys and class_names.
Catalog MakeCatalog(Kind kind, std::vector<std::string> keys);

// Checks a `__len__` value (a pickled int or decimal text) against the number of samples.
Status CheckLen(std::string_view lkey, const Bytes& value, uint64_t samples, const std::string& where);

// Decodes one value into a sample. `value` is a view that stays alive with its owner.
Status Decode(const Catalog& cat, std::string_view lkey, const Bytes& value, uint64_t index, const std::string& where,
              Sample* out);

// What the layout "pickle" writer puts in an LMDB value: the bytes of
// pickle.dumps((arr, label), protocol=4) as Python with numpy writes them for a
// C- or Fortran-order array (numpy.core.multiarray._reconstruct, numpy.ndarray,
// numpy.dtype and a BUILD state; no FRAME, no memo), label an int or None. The
// reader above (and Python's pickle.loads) read it back to the same array.
std::string PickleArray(const pickle::NdArray& arr, std::optional<int64_t> label);

// The image type of encoded bytes by their magic ("jpg", "png", "webp", "avif", "jxl", "bmp", "gif", "tiff"), or "".
std::string_view SniffImage(std::string_view b);

}  // namespace shardkit::formats::lmdb::wild
