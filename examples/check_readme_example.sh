#!/usr/bin/env bash
# Fails if the first C++ block of README.md differs from examples/readme_example.cpp
# (after that file's two-line header comment). Usage: check_readme_example.sh <repo root>
set -euo pipefail
root=${1:?usage: check_readme_example.sh <repo root>}
diff -u <(tail -n +3 "$root/examples/readme_example.cpp") \
        <(awk '/^```cpp$/ && !done {on=1; next} /^```$/ && on {on=0; done=1} on' "$root/README.md") ||
  { echo "README.md's example and examples/readme_example.cpp differ: keep them identical" >&2; exit 1; }
echo "README.md's example matches examples/readme_example.cpp"
