// SHA-1 as scripts name themselves (EVALSHA, SCRIPT LOAD, redis.sha1hex): the
// 40 lowercase hex digits of the SHA-1 of the bytes (FIPS 180-4).
#pragma once

#include <string>
#include <string_view>

namespace conveyor::kv {

std::string sha1_hex(std::string_view bytes);

}  // namespace conveyor::kv
