// SHA-1 for script names, from OpenSSL's libcrypto (not used for anything secret).
#include "script_sha1.hpp"

#include <openssl/evp.h>

#include <array>
#include <stdexcept>

namespace conveyor::kv {

std::string sha1_hex(std::string_view bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest.data(), &len, EVP_sha1(), nullptr) != 1 ||
      len != 20)
    throw std::runtime_error("libcrypto: SHA-1 failed");
  static constexpr char hex[] = "0123456789abcdef";
  std::string out(2 * len, '0');
  for (unsigned int i = 0; i < len; ++i) {
    out[2 * i] = hex[digest[i] >> 4];
    out[2 * i + 1] = hex[digest[i] & 0xf];
  }
  return out;
}

}  // namespace conveyor::kv
