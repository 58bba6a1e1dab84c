# Writes the man pages of the conveyor command from its own --help text, so the
# pages say exactly what the tool prints: conveyor.1 (the top level) and
# conveyor-<subcommand>.1 for every subcommand its --help lists (kv's page has
# its subcommands too). Run by the build: cmake -DTOOL=... -DOUT=... -DVERSION=... -P gen_man.cmake
function(roff_escape text out)
  string(REPLACE "\\" "\\e" text "${text}")
  string(REGEX REPLACE "(^|\n)([.'])" "\\1\\\\&\\2" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

function(help_of out)
  # (A sanitizer build's leak report must not fail the build: tests/tools checks the tool.)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=0 ${TOOL} ${ARGN} --help
                  OUTPUT_VARIABLE text RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "conveyor ${ARGN} --help failed (${rc})")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

function(write_page name title summary body)
  string(TOUPPER "${name}" upper)
  roff_escape("${body}" body)
  file(WRITE "${OUT}/${name}.1.tmp"
".TH ${upper} 1 \"\" \"conveyor ${VERSION}\" \"Conveyor\"
.SH NAME
${name} \\- ${summary}
.SH DESCRIPTION
The text below is what
.B ${title} --help
prints.
.PP
.nf
${body}
.fi
.SH SEE ALSO
.BR conveyor (1),
docs/CLI.md in the Conveyor sources
")
  file(RENAME "${OUT}/${name}.1.tmp" "${OUT}/${name}.1")
endfunction()

file(MAKE_DIRECTORY "${OUT}")
help_of(top)
write_page(conveyor "conveyor" "RDMA devices, performance tests (perftest's flags too) and conveyor-kv" "${top}")
# (";" would split CMake's list: the summaries use "," instead.)
string(REPLACE ";" "," scan "${top}")
string(REGEX MATCHALL "\n  [a-z_]+ +[^\n]*" lines "${scan}")
foreach(line ${lines})
  string(REGEX MATCH "^\n  ([a-z_]+) +(.*)$" _ "${line}")
  set(sub "${CMAKE_MATCH_1}")
  set(summary "${CMAKE_MATCH_2}")
  string(REPLACE "\\" "\\\\" summary "${summary}")
  help_of(text ${sub})
  if(sub STREQUAL "kv")
    foreach(kvsub serve get set del)
      help_of(kvtext kv ${kvsub})
      string(APPEND text "\n\nconveyor kv ${kvsub} --help:\n\n${kvtext}")
    endforeach()
  endif()
  write_page("conveyor-${sub}" "conveyor ${sub}" "${summary}" "${text}")
endforeach()
