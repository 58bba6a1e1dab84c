# CPack: the Debian packages that scripts/package builds (docs/ARCHITECTURE.md,
# "Build and install"). One package per install component:
#   libconveyor0     component lib    libconveyor.so.0 (the runtime)
#   libconveyor-dev  component dev    headers, libconveyor.so link, libconveyor.a,
#                                     CMake package config, conveyor.pc, conveyor-static.pc
#   conveyor-tools   component tools  the conveyor command and conveyor-demo
# The Python packages (component python, with conveyor_gloo) and conveyor-gloo's libraries (component gloo) are not packaged.
# Run-time dependencies are computed from the binaries by dpkg-shlibdeps
# (CPACK_DEBIAN_PACKAGE_SHLIBDEPS); the dependencies between the three are
# exact-version ones. rdma-core is not among them: libconveyor.so loads it
# (dlopen) when a verbs device is first used, so libconveyor0 only Recommends
# it, and soft and shm work without it.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME conveyor)
set(CPACK_PACKAGE_VENDOR "Conveyor")
set(CPACK_PACKAGE_CONTACT "Conveyor developers <conveyor@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL lib dev tools)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # name_version_arch.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
# dpkg-shlibdeps finds libconveyor.so.0, which conveyor-tools needs, in the build
# tree; libconveyor0's own dependency is stated below.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/src)
set(CPACK_PACKAGE_INSTALL_DIRECTORY conveyor)
set(CPACK_STRIP_FILES OFF)  # keep the symbols: the build is RelWithDebInfo

set(conveyor_deb_version "${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")
set(CPACK_DEBIAN_LIB_PACKAGE_NAME libconveyor0)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
if(CONVEYOR_HAVE_VERBS)  # the verbs provider's libraries, loaded at run time
  set(CPACK_DEBIAN_LIB_PACKAGE_RECOMMENDS "libibverbs1, librdmacm1, ibverbs-providers")
endif()
# The library's own shlibs file, so packages built against it depend on it.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_COMPONENT_LIB_DESCRIPTION "Conveyor RDMA library (runtime)
 RDMA with verbs semantics in C++23: devices, protection domains, memory
 regions, completion queues, queue pairs and a connection manager, over the
 soft provider (iWARP over TCP), shm (same host) and verbs (rdma-core,
 loaded when a verbs device is first used; for RDMA NICs install
 libibverbs1, librdmacm1 and ibverbs-providers).")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libconveyor-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# The archive needs ISA-L's development files to link a program statically;
# the shared library needs none. Neither needs rdma-core's (its libraries are
# loaded at run time).
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libconveyor0 (= ${conveyor_deb_version})")
set(CPACK_DEBIAN_DEV_PACKAGE_SUGGESTS "libisal-dev, pkg-config, cmake")
set(CPACK_COMPONENT_DEV_DESCRIPTION "Conveyor RDMA library (development files)
 Headers, the shared library link, the static archive, the CMake package
 (find_package(conveyor): conveyor::conveyor, conveyor::conveyor_static) and
 pkg-config files (conveyor, conveyor-static). Static linking needs
 libisal-dev.")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME conveyor-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION net)
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "libconveyor0 (= ${conveyor_deb_version})")
set(CPACK_COMPONENT_TOOLS_DESCRIPTION "Conveyor RDMA library (command-line tools)
 conveyor: devices, perf (perftest-style bandwidth and latency, with
 perftest's flags), kv (a Redis-compatible store with one-sided GETs);
 conveyor-demo: every verb between two processes, every byte verified.")

include(CPack)
