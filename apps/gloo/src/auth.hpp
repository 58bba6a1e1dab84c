// auth.hpp — the MACs of conveyor-gloo's pair handshake (wire.hpp: hello,
// hello_reply) and the randomness behind keys and nonces, from OpenSSL's
// libcrypto (HMAC-SHA256, RAND_bytes, CRYPTO_memcmp).
#pragma once

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "wire.hpp"

namespace conveyor_gloo::auth {

using mac = std::array<std::uint8_t, wire::mac_size>;

// Which message a MAC belongs to: a hello's MAC never passes as a reply's.
enum class role { hello, reply };

// HMAC-SHA256 (its first wire::mac_size bytes) under the pair's key over: a label naming the role,
// the connector's and the acceptor's rank, the acceptor's nonce, the connector's. Every field has a
// fixed length, so no two inputs encode alike.
inline mac compute(const std::uint8_t (&key)[wire::key_size], role r, std::uint32_t connector,
                   std::uint32_t acceptor, const std::uint8_t (&acceptor_nonce)[wire::nonce_size],
                   const std::uint8_t (&connector_nonce)[wire::nonce_size]) {
  constexpr std::string_view hello_label = "conveyor-gloo pair hello v2";
  constexpr std::string_view reply_label = "conveyor-gloo pair reply v2";
  static_assert(hello_label.size() == reply_label.size());
  std::array<std::byte, hello_label.size() + 8 + 2 * wire::nonce_size> msg{};
  auto label = r == role::hello ? hello_label : reply_label;
  std::memcpy(msg.data(), label.data(), label.size());
  std::size_t off = label.size();
  wire::put32(msg.data() + off, connector);
  wire::put32(msg.data() + off + 4, acceptor);
  std::memcpy(msg.data() + off + 8, acceptor_nonce, wire::nonce_size);
  std::memcpy(msg.data() + off + 8 + wire::nonce_size, connector_nonce, wire::nonce_size);
  std::array<std::uint8_t, 32> full{};
  unsigned int len = 0;
  mac out{};
  if (::HMAC(EVP_sha256(), key, int(wire::key_size), reinterpret_cast<unsigned char*>(msg.data()),
             msg.size(), full.data(), &len) == nullptr ||
      len != full.size())
    return out;  // all zero: never equal to a MAC that checks (verify() refuses it)
  std::memcpy(out.data(), full.data(), out.size());  // truncated (wire.hpp, mac_size)
  return out;
}

// Constant-time comparison; an all-zero expected MAC (HMAC failed) never matches.
inline bool verify(const mac& expected, const std::uint8_t (&got)[wire::mac_size]) {
  mac zero{};
  if (CRYPTO_memcmp(expected.data(), zero.data(), zero.size()) == 0) return false;
  return CRYPTO_memcmp(expected.data(), got, expected.size()) == 0;
}

// Fills `out` from the system's CSPRNG; false if it could not.
inline bool random_bytes(std::uint8_t* out, std::size_t n) {
  return ::RAND_bytes(out, int(n)) == 1;
}

}  // namespace conveyor_gloo::auth
