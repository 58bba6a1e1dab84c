// The code example of the top-level README.md, kept here so that it compiles
// and runs (ctest: readme_example). Keep the two copies identical.
#include <conveyor/conveyor.hpp>

#include <cstdio>
#include <thread>
#include <vector>

namespace cvy = conveyor;
using namespace std::chrono_literals;

int main() {
  auto dev = cvy::device::open("soft").value();  // the software RNIC: iWARP over TCP
  auto pd = dev.alloc_pd().value();
  auto cq = dev.create_cq({.depth = 256}).value();

  // Target: register memory that peers may read, listen, hand out its key on accept.
  std::vector<std::byte> shelf(1 << 20, std::byte{42});
  auto shelf_mr =
      pd.register_memory(std::span(shelf), cvy::access::local_write | cvy::access::remote_read)
          .value();
  auto lis = cvy::listener::bind(dev, "127.0.0.1:0").value();  // port 0: any free port
  auto address = lis.address();
  auto target_qp = pd.create_qp({.send_cq = &cq, .recv_cq = &cq}).value();
  std::jthread target([&] {
    auto req = lis.accept(5s).value();  // req.private_data() holds what the peer sent
    req.accept(target_qp, shelf_mr.remote().encode()).value();
  });  // from here on the target's threads do nothing: its engine serves the READ

  // Initiator: connect, decode the peer's key, read 4 KiB of its memory one-sided.
  std::vector<std::byte> local(4096);
  auto local_mr = pd.register_memory(std::span(local), cvy::access::local_write).value();
  auto qp = pd.create_qp({.send_cq = &cq, .recv_cq = &cq}).value();
  auto conn = cvy::connect(qp, address).value();
  auto peer = cvy::remote_region::decode(conn.private_data).value();
  if (qp.post_read(local_mr.as_sge(), peer.slice(0, 4096), /*wr_id=*/7) != cvy::errc::ok) return 1;
  auto wc = cq.wait_one(5s).value();  // the READ's completion: the bytes are in `local`
  auto status = cvy::to_string(wc.status);
  std::printf("READ %.*s, %u bytes, first byte %d\n", static_cast<int>(status.size()),
              status.data(), wc.byte_len, std::to_integer<int>(local[0]));
  return wc.status == cvy::wc_status::success && local[0] == std::byte{42} ? 0 : 1;
}
