// Issue 41: is a DCT-scaled decode at any n/8 cheaper than libjpeg-turbo's SIMD scales?
// Decodes each JPEG given (CMYK/YCCK and non-JPEG files are passed over) towards a short
// side of TARGET at three scale policies, one thread, whole images to RGB, best of 3 passes:
//   8/8     no DCT scaling;
//   pow2    the smallest of 8/8, 4/8, 2/8, 1/8 whose short side stays >= TARGET (what
//           decode/jpeg.cc and convert --resize use: the scales with SIMD IDCTs);
//   any n/8 the smallest n/8 whose short side stays >= TARGET (3/8..7/8 run plain C IDCTs).
//   sk_dct_scale_bench TARGET FILE...     (e.g. 256 $(find corpus -name '*.JPEG'))
// Prints seconds and megapixels out per policy; docs/benchmarks.md, "Transform at conversion".
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <jpeglib.h>  // (after <cstdio>: it needs size_t and FILE)

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TARGET FILE...\n", argv[0]);
    return 2;
  }
  const int target = std::atoi(argv[1]);
  std::vector<std::string> files;
  for (int i = 2; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    std::string b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (b.size() > 3 && uint8_t(b[0]) == 0xFF && uint8_t(b[1]) == 0xD8) files.push_back(std::move(b));
  }
  const char* names[] = {"8/8", "pow2", "any n/8"};
  double base = 0;
  for (int mode = 0; mode < 3; ++mode) {
    double best = 0, mpx = 0;
    size_t decoded = 0;
    for (int pass = 0; pass < 3; ++pass) {
      const auto t0 = std::chrono::steady_clock::now();
      double px = 0;
      decoded = 0;
      for (const auto& b : files) {
        jpeg_decompress_struct c;
        jpeg_error_mgr e;
        c.err = jpeg_std_error(&e);
        jpeg_create_decompress(&c);
        jpeg_mem_src(&c, reinterpret_cast<const unsigned char*>(b.data()), b.size());
        jpeg_read_header(&c, TRUE);
        if (c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK) {
          jpeg_destroy_decompress(&c);
          continue;
        }
        const int s = int(std::min(c.image_width, c.image_height));
        int num = 8;
        if (mode == 1)
          while (num > 1 && s * (num / 2) / 8 >= target) num /= 2;
        if (mode == 2)
          while (num > 1 && s * (num - 1) / 8 >= target) --num;
        c.scale_num = unsigned(num);
        c.scale_denom = 8;
        c.out_color_space = JCS_RGB;
        jpeg_start_decompress(&c);
        std::vector<unsigned char> row(size_t(c.output_width) * c.output_components);
        while (c.output_scanline < c.output_height) {
          JSAMPROW r = row.data();
          jpeg_read_scanlines(&c, &r, 1);
        }
        px += double(c.output_width) * c.output_height;
        jpeg_finish_decompress(&c);
        jpeg_destroy_decompress(&c);
        ++decoded;
      }
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (pass == 0 || dt < best) best = dt;
      mpx = px / 1e6;
    }
    if (mode == 0) base = best;
    std::printf("%-8s %8.3f s  %7.1f Mpx out  %5.2fx the time of 8/8  (%zu JPEGs)\n", names[mode], best, mpx,
                best / base, decoded);
  }
  return 0;
}
