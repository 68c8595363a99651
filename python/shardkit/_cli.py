"""The `shardkit` command of a wheel install: the console-script entry point replaces
this process with the bundled command (shardkit/_bin/shardkit), so that flags, output,
signals (Ctrl-C stops a conversion cleanly) and exit statuses are the command's own."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "shardkit")
    if not os.access(exe, os.X_OK):
        sys.stderr.write("shardkit: error: this install has no command (%s is missing); the wheel "
                         "built by `pip wheel --no-build-isolation .` holds it\n" % exe)
        return 1
    os.execv(exe, ["shardkit"] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
