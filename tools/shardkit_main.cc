// The shardkit command: parses arguments, calls the library, prints.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "shardkit/shardkit.h"

int main(int argc, char** argv) {
  CLI::App app{"shardkit: pack, convert, verify and benchmark training datasets"};
  app.set_version_flag("--version", shardkit::Version());
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
