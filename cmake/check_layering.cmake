# The `layering` test: the rooms of src/ (src/CMakeLists.txt, conveyor_room)
# may include only what they are given, and the build enforces it.
#
#   cmake -DROOMS_DIR=<build>/src/rooms -DSRC=<source>/src -DCXX=<compiler>
#         -DWORK=<scratch folder> -P cmake/check_layering.cmake
#
# 1. For every room and every room's probe header (and a public header), it
#    runs the room's compiler on a one-line probe with the room's own include
#    paths and compile options (written by the build into <room>.cmake),
#    preprocessing only (-E: includes are resolved there, and it is ten times
#    cheaper than a compile): a header of the room itself, of a room it MAY
#    include, of a room nested in its folder (soft and shm hold wire/ and net/) or of
#    the public API must be found with everything it includes; any other must
#    fail with "No such file or directory" (g++) / "file not found" (clang).
#    Then one probe per room that includes every header it was allowed is
#    compiled (-fsyntax-only, the room's warnings as errors).
# 2. The nevers below hold whatever the rooms' MAY lists say: each must be
#    refused by the compiler, so widening a MAY list to allow one fails here.
# 3. No source in src/ reaches around its room with a relative path: a quoted
#    include naming ".." or a sub-folder of the including file's folder fails
#    (the paths are spelled from a room's root: "core/log.hpp",
#    "providers/swnic/sw_qp.hpp"; a file of the same folder may be named alone).
cmake_minimum_required(VERSION 3.25)
foreach(v ROOMS_DIR SRC CXX WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_layering: -D${v}= is required")
  endif()
endforeach()

# room:room it must never include (docs/ARCHITECTURE.md, "Rooms").
set(nevers
  # core includes no provider and no swnic
  core:swnic core:soft core:soft_wire core:soft_net core:shm core:shm_wire core:shm_net core:verbs
  # swnic reaches neither soft nor shm (nor verbs)
  swnic:soft swnic:soft_wire swnic:soft_net swnic:shm swnic:shm_wire swnic:shm_net swnic:verbs
  # no provider includes another; verbs is no software NIC
  soft:shm soft:shm_wire soft:shm_net soft:verbs shm:soft shm:soft_wire shm:soft_net shm:verbs
  verbs:swnic verbs:soft verbs:soft_wire verbs:soft_net verbs:shm verbs:shm_wire verbs:shm_net
  # soft's wire codecs have no sockets and no state; its net knows no iWARP
  soft_wire:soft_net soft_wire:soft soft_wire:swnic soft_wire:shm_wire soft_wire:shm_net
  soft_net:soft_wire soft_net:soft soft_net:swnic soft_net:shm_wire soft_net:shm_net
  # shm's the same: its layout has no sockets, its sockets know no rings
  shm_wire:shm_net shm_wire:shm shm_wire:swnic shm_wire:soft_wire shm_wire:soft_net
  shm_net:shm_wire shm_net:shm shm_net:swnic shm_net:soft_wire shm_net:soft_net)

include(${ROOMS_DIR}/rooms.cmake)  # conveyor_rooms
foreach(room IN LISTS conveyor_rooms)
  include(${ROOMS_DIR}/${room}.cmake)  # room_<room>_{folder,probe,may,includes,options}
endforeach()
set(public_probe conveyor/conveyor.hpp)

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(failures "")
set(found 0)
set(compiled 0)
set(refused 0)

foreach(room IN LISTS conveyor_rooms)
  set(args ${room_${room}_options})
  foreach(dir IN LISTS room_${room}_includes)
    list(APPEND args "-I${dir}")
  endforeach()
  set(allowed_headers "")
  foreach(target IN LISTS conveyor_rooms ITEMS public)
    if(target STREQUAL "public")
      set(header ${public_probe})
      set(allowed TRUE)
    else()
      set(header ${room_${target}_probe})
      set(allowed FALSE)
      string(FIND "${room_${target}_folder}/" "${room_${room}_folder}/" at)
      if(target STREQUAL room OR target IN_LIST room_${room}_may OR at EQUAL 0)
        set(allowed TRUE)
      endif()
      if("${room}:${target}" IN_LIST nevers)
        if(allowed)
          list(APPEND failures "${room} -> ${target}: allowed by src/CMakeLists.txt, but it is a never")
        endif()
        set(allowed FALSE)
      endif()
    endif()
    set(probe ${WORK}/${room}-includes-${target}.cpp)
    file(WRITE ${probe} "// the layering test: room ${room} includes ${header}\n#include \"${header}\"\n")
    execute_process(COMMAND ${CXX} ${args} -E -o ${probe}.i ${probe}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    file(REMOVE ${probe}.i)
    string(REGEX MATCH "[^\n]*(No such file or directory|file not found)[^\n]*" missing "${out}")
    if(allowed)
      if(rc EQUAL 0)
        math(EXPR found "${found} + 1")
        list(APPEND allowed_headers ${header})
        message(STATUS "ok      ${room} may include ${header}: found")
      else()
        list(APPEND failures "${room} -> ${target}: ${header} is allowed but not found:\n${out}")
      endif()
    else()
      if(NOT rc EQUAL 0 AND missing AND missing MATCHES "${header}")
        math(EXPR refused "${refused} + 1")
        message(STATUS "ok      ${room} may not include ${header}: ${missing}")
      elseif(rc EQUAL 0)
        list(APPEND failures "${room} -> ${target}: ${header} is forbidden but compiles")
      else()
        list(APPEND failures "${room} -> ${target}: ${header} is forbidden but fails for another reason:\n${out}")
      endif()
    endif()
  endforeach()
  set(probe ${WORK}/${room}-includes-what-it-may.cpp)
  set(text "// the layering test: room ${room} compiles with every header it may include\n")
  foreach(header IN LISTS allowed_headers)
    string(APPEND text "#include \"${header}\"\n")
  endforeach()
  file(WRITE ${probe} "${text}")
  execute_process(COMMAND ${CXX} ${args} -fsyntax-only ${probe}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(rc EQUAL 0)
    math(EXPR compiled "${compiled} + 1")
    list(JOIN allowed_headers ", " shown)
    message(STATUS "ok      ${room} compiles with ${shown}")
  else()
    list(APPEND failures "${room}: the headers it may include do not compile together:\n${out}")
  endif()
endforeach()

# 3. Relative includes that would step around the include paths.
file(GLOB_RECURSE sources LIST_DIRECTORIES false ${SRC}/*.cpp ${SRC}/*.hpp)
foreach(file IN LISTS sources)
  get_filename_component(dir ${file} DIRECTORY)
  file(STRINGS ${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]*)\".*" "\\1" name "${line}")
    file(RELATIVE_PATH shown ${SRC} ${file})
    if(name MATCHES "(^|/)\\.\\.(/|$)")
      list(APPEND failures "src/${shown}: #include \"${name}\" steps out of its folder")
    elseif(name MATCHES "/" AND EXISTS ${dir}/${name})
      list(APPEND failures "src/${shown}: #include \"${name}\" names a file by its path from this folder, not from its room's root")
    endif()
  endforeach()
endforeach()

list(LENGTH conveyor_rooms nrooms)
if(failures)
  list(JOIN failures "\n  " text)
  message(FATAL_ERROR "layering: broken:\n  ${text}")
endif()
message(STATUS "layering: ${nrooms} rooms; ${found} allowed includes are found and compile in "
               "${compiled} rooms, ${refused} forbidden ones are refused by the compiler; "
               "no relative include steps around them")
