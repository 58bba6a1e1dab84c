// conveyor::kv::store — the collections' side of the store (store_impl.hpp):
// a key's type, its collection object (created, found, counted, dropped with
// the key), a small hash's item republished after each change, and RENAME,
// which carries the object to the new key. The objects live in server memory;
// only a key's item is exported (docs/KV.md, "Collections").
#include <cstdio>

#include "store_impl.hpp"

namespace conveyor::kv {

namespace {
namespace L = layout;
}  // namespace

std::optional<value_type> store_impl::type_of(std::string_view key, time_ms now) {
  auto f = find_live(key, now);
  if (!f) return std::nullopt;
  return type_at(f->item);
}

std::optional<value_type> store_impl::peek_type(std::string_view key) const {
  auto f = find(key);
  if (!f) return std::nullopt;
  return type_at(f->item);
}

collection* store_impl::find_collection(std::string_view key, value_type t, time_ms now,
                                        bool* wrong) {
  *wrong = false;
  auto f = find_live(key, now);
  if (!f) return nullptr;
  lru_[f->slot_index] = ++clock_;
  if (type_at(f->item) != t) {
    *wrong = true;
    return nullptr;
  }
  auto it = objects_.find(key);
  return it == objects_.end() ? nullptr : it->second.get();
}

collection* store_impl::create_collection(std::string_view key, value_type t, time_ms now) {
  if (key.size() > opts_.max_key || find_live(key, now)) return nullptr;
  std::unique_ptr<collection> o;
  switch (t) {
    case value_type::hash:
      o = std::make_unique<hash_object>();
      break;
    case value_type::list:
      o = std::make_unique<list_object>();
      break;
    case value_type::set:
      o = std::make_unique<set_object>();
      break;
    case value_type::zset:
      o = std::make_unique<zset_object>();
      break;
    case value_type::string:
      return nullptr;
  }
  std::string value;
  if (t == value_type::hash) L::encode_hash_begin(value, 0);
  const auto units = L::round_units(L::item_bytes(key.size(), value.size()));
  if (write(key, value, t, 0, std::nullopt, units, now, false) != put_status::stored)
    return nullptr;
  o->version = version_;
  auto* raw = o.get();
  objects_.insert_or_assign(std::string(key), std::move(o));
  return raw;
}

void store_impl::changed(std::string_view key, time_ms now) {
  auto f = find(key);
  auto it = objects_.find(key);
  if (!f || it == objects_.end()) return;
  collection& o = *it->second;
  if (o.size() == 0) {
    unlink(*f);  // drops the object
    return;
  }
  object_bytes_ = object_bytes_ - o.charged + o.bytes;
  o.charged = o.bytes;
  o.version = ++version_;
  lru_[f->slot_index] = ++clock_;
  if (o.type != value_type::hash) return;
  // A hash's item is its encoding while it is small, then the served mark.
  auto& h = static_cast<hash_object&>(o);
  const auto& lim = opts_.encodings;
  if (!h.big && h.fields.size() > lim.hash_max_listpack_entries) h.big = true;
  const bool was_served = value_of(f->item) == std::string_view("\x02", 1);
  if (h.big && was_served) return;
  if (h.big) {
    scratch_.assign(1, static_cast<char>(L::hash_served));
  } else {
    L::encode_hash_begin(scratch_, static_cast<std::uint32_t>(h.fields.size()));
    for (const auto* e : h.fields) L::encode_hash_field(scratch_, e->key(), e->value);
  }
  const std::string k(key);
  auto units = L::round_units(L::item_bytes(k.size(), scratch_.size()));
  if (write(k, scratch_, value_type::hash, f->item->expire_at, f, units, now, true) ==
      put_status::stored)
    return;
  // No room for the encoding (the commands asked can_publish first, so this
  // is a write past maxmemory): the one-sided readers are sent to the
  // server rather than left with the old fields. Retired memory is never
  // freed early here: a reader within the grace time relies on it.
  scratch_.assign(1, static_cast<char>(L::hash_served));
  units = L::round_units(L::item_bytes(k.size(), 1));
  if (auto g = find(k); g && write(k, scratch_, value_type::hash, g->item->expire_at, g, units, now,
                                   true) == put_status::stored)
    return;
  std::fprintf(stderr,
               "conveyor kv: no memory to republish hash '%.64s': its one-sided readers see "
               "the previous version until its next write\n",
               k.c_str());
}

bool store_impl::can_publish(std::string_view key, std::size_t extra, time_ms now) {
  auto f = find(key);
  if (!f || type_at(f->item) != value_type::hash) return true;
  auto it = objects_.find(key);
  if (it == objects_.end() || it->second->big) return true;
  const auto need = L::round_units(L::item_bytes(key.size(), f->item->value_len + extra));
  if (alloc_.can_allocate(need)) return true;
  reclaim(now);
  return alloc_.can_allocate(need);
}

bool store_impl::rename(std::string_view from, std::string_view to, time_ms now, bool* oom) {
  *oom = false;
  auto f = find_live(from, now);
  if (!f) return false;
  if (from == to) return true;
  const std::string key(to);
  const std::string value(value_of(f->item));
  const auto type = type_at(f->item);
  const auto expire = f->item->expire_at;
  std::unique_ptr<collection> obj;
  if (auto it = objects_.find(from); it != objects_.end()) {
    obj = std::move(it->second);
    objects_.erase(it);
  }
  auto restore = [&] {
    if (obj) objects_.insert_or_assign(std::string(from), std::move(obj));
  };
  // The copy replaces the destination's item (and drops its collection) in one
  // write: refused for memory, it leaves both keys as they were.
  const auto dest = find_live(to, now);
  const auto units = L::round_units(L::item_bytes(key.size(), value.size()));
  if (key.size() > opts_.max_key ||
      write(key, value, type, expire, dest, units, now, false) != put_status::stored) {
    restore();
    *oom = true;
    return false;
  }
  if (auto g = find(from)) unlink(*g);  // its object was taken out first: kept
  if (obj) {
    obj->version = version_;
    objects_.insert_or_assign(key, std::move(obj));
  }
  return true;
}

void store_impl::drop_object(const L::item_header* it) {
  if (type_at(it) == value_type::string) return;
  auto o = objects_.find(key_of(it));
  if (o == objects_.end()) return;
  object_bytes_ -= o->second->charged;
  objects_.erase(o);
}

}  // namespace conveyor::kv
