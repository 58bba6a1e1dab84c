// conveyor/export.hpp — CONVEYOR_API marks what libconveyor.so exports.
//
// The library is compiled with hidden visibility: only the classes and
// functions of these public headers that carry CONVEYOR_API are exported from
// the shared library (and versioned CONVEYOR_0 by its version script); every
// provider's internals stay inside it. For a consumer the macro changes nothing.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define CONVEYOR_API __attribute__((visibility("default")))
#else
#define CONVEYOR_API
#endif
