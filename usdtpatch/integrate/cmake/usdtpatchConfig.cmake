# usdtpatch's CMake config package (package data of the Python package usdtpatch).
#
#   find_package(usdtpatch CONFIG REQUIRED)
#   usdtpatch_rewrite(<target> [FORM nop5|combo5|combo10] [REDZONE_GUARD auto|always|never]
#                     [FORK_GUARD auto|always|never] [REPORT <file.json>]
#                     [FAIL_ON info|warning|error|never] [NO_VERIFY])
#   usdtpatch_check(<target> [REPORT <file.json>] [FAIL_ON info|warning|error|never])
#   usdtpatch_use_headers(<target> [FORM nop5|combo5|combo10|nop1]
#                         [REDZONE_GUARD | NO_REDZONE_GUARD])
#
# Found with `cmake -Dusdtpatch_DIR="$(usdtpatch --cmake-dir)"` (or CMAKE_PREFIX_PATH), and with
# no flag at all in scikit-build-core builds that list usdtpatch in build-system.requires (the
# `cmake.root` entry point). See docs/build-integration.md in the usdtpatch sources.
#
# usdtpatch_rewrite and usdtpatch_check add a POST_BUILD step to <target>. POST_BUILD steps run
# in the order they were added: call usdtpatch_rewrite right after the target is defined, so
# that it runs before any strip or debug-info split step the project adds (strip,
# objcopy --only-keep-debug/--add-gnu-debuglink) and before `cmake --install --strip`. A
# rewritten file survives those tools; a rewrite after them works too.

if(CMAKE_VERSION VERSION_LESS 3.16)
  set(usdtpatch_FOUND FALSE)
  set(usdtpatch_NOT_FOUND_MESSAGE "usdtpatch's CMake functions need CMake 3.16 or newer")
  return()
endif()

get_filename_component(_usdtpatch_pkg "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
set(USDTPATCH_INCLUDE_DIR "${_usdtpatch_pkg}/include")  # usdtpatch's sys/sdt.h
set(USDTPATCH_MAKE_INCLUDE "${_usdtpatch_pkg}/make/usdtpatch.mk")

# The `usdtpatch` command that runs the step. Set USDTPATCH_EXECUTABLE to choose one; else the
# script installed with this package (a venv's or prefix's bin/, found from this file's place
# in site-packages), else the first `usdtpatch` on PATH.
if(NOT USDTPATCH_EXECUTABLE)
  get_filename_component(_usdtpatch_prefix "${_usdtpatch_pkg}/../../../../.." ABSOLUTE)
  find_program(USDTPATCH_EXECUTABLE NAMES usdtpatch
    HINTS "${_usdtpatch_prefix}/bin" "${_usdtpatch_prefix}/local/bin"
    DOC "the usdtpatch command line")
endif()
if(NOT USDTPATCH_EXECUTABLE)
  set(usdtpatch_FOUND FALSE)
  set(usdtpatch_NOT_FOUND_MESSAGE
      "the usdtpatch command is not on PATH (set USDTPATCH_EXECUTABLE to its path)")
  return()
endif()

# The functions below keep the policies of CMake 3.16 whatever the calling project sets.
cmake_policy(PUSH)
cmake_policy(VERSION 3.16)

set(_usdtpatch_forms nop5 combo5 combo10)
set(_usdtpatch_guards auto always never)
set(_usdtpatch_levels info warning error never)

function(_usdtpatch_choice what value allowed)
  if(NOT value IN_LIST allowed)
    string(REPLACE ";" ", " _list "${allowed}")
    message(FATAL_ERROR "usdtpatch: ${what} must be one of ${_list}, not '${value}'")
  endif()
endfunction()

function(_usdtpatch_linked_target fn target)
  if(NOT TARGET ${target})
    message(FATAL_ERROR "${fn}: '${target}' is not a target")
  endif()
  get_target_property(_type ${target} TYPE)
  if(NOT _type MATCHES "^(EXECUTABLE|SHARED_LIBRARY|MODULE_LIBRARY)$")
    message(FATAL_ERROR "${fn}: '${target}' is a ${_type}; only executables and shared or "
                        "module libraries are linked files with probe sites to rewrite")
  endif()
endfunction()

# The step shared by usdtpatch_rewrite and usdtpatch_check.
function(_usdtpatch_step fn target mode)
  cmake_parse_arguments(PARSE_ARGV 3 ARG "NO_VERIFY"
                        "FORM;REDZONE_GUARD;FORK_GUARD;REPORT;FAIL_ON" "")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "${fn}: unknown arguments: ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  _usdtpatch_linked_target(${fn} ${target})
  if(NOT ARG_FORM)
    set(ARG_FORM nop5)
  endif()
  if(NOT ARG_REDZONE_GUARD)
    set(ARG_REDZONE_GUARD auto)
  endif()
  if(NOT ARG_FAIL_ON)
    set(ARG_FAIL_ON error)
  endif()
  get_property(_multi GLOBAL PROPERTY GENERATOR_IS_MULTI_CONFIG)
  if(NOT ARG_REPORT AND _multi)
    set(ARG_REPORT "${CMAKE_CURRENT_BINARY_DIR}/usdtpatch/$<CONFIG>/${target}.json")
  elseif(NOT ARG_REPORT)
    set(ARG_REPORT "${CMAKE_CURRENT_BINARY_DIR}/usdtpatch/${target}.json")
  elseif(NOT IS_ABSOLUTE "${ARG_REPORT}")
    set(ARG_REPORT "${CMAKE_CURRENT_BINARY_DIR}/${ARG_REPORT}")
  endif()
  _usdtpatch_choice(FORM "${ARG_FORM}" "${_usdtpatch_forms}")
  _usdtpatch_choice(REDZONE_GUARD "${ARG_REDZONE_GUARD}" "${_usdtpatch_guards}")
  _usdtpatch_choice(FAIL_ON "${ARG_FAIL_ON}" "${_usdtpatch_levels}")
  if(ARG_FORK_GUARD)
    _usdtpatch_choice(FORK_GUARD "${ARG_FORK_GUARD}" "${_usdtpatch_guards}")
  endif()
  set(_args --report "${ARG_REPORT}" --fail-on ${ARG_FAIL_ON})
  if(mode STREQUAL "check")
    list(APPEND _args --check-only)
    set(_what "checking")
  else()
    list(APPEND _args --form ${ARG_FORM} --redzone-guard ${ARG_REDZONE_GUARD})
    if(ARG_FORK_GUARD)
      list(APPEND _args --fork-guard ${ARG_FORK_GUARD})
    endif()
    if(ARG_NO_VERIFY)
      list(APPEND _args --no-verify)
    endif()
    set(_what "rewriting")
  endif()
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND "${USDTPATCH_EXECUTABLE}" post-link "$<TARGET_FILE:${target}>" ${_args}
    COMMENT "usdtpatch: ${_what} the probe sites of ${target}"
    VERBATIM)
endfunction()

function(usdtpatch_rewrite target)
  _usdtpatch_step(usdtpatch_rewrite ${target} rewrite ${ARGN})
endfunction()

function(usdtpatch_check target)
  _usdtpatch_step(usdtpatch_check ${target} check ${ARGN})
endfunction()

# usdtpatch's sys/sdt.h first on the target's include path: 5-byte NOP sites at build time,
# nothing to rewrite. FORM picks the site form (USDTPATCH_SITE_FORM). The header's red-zone
# guard is on by default with nop5 and combo5; NO_REDZONE_GUARD turns it off
# (USDTPATCH_REDZONE_GUARD=0: only for code built with -mno-red-zone), REDZONE_GUARD asks for it
# with every form (USDTPATCH_REDZONE_GUARD=1).
function(usdtpatch_use_headers target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "REDZONE_GUARD;NO_REDZONE_GUARD" "FORM" "")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "usdtpatch_use_headers: unknown arguments: ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT TARGET ${target})
    message(FATAL_ERROR "usdtpatch_use_headers: '${target}' is not a target")
  endif()
  target_include_directories(${target} BEFORE PRIVATE "${USDTPATCH_INCLUDE_DIR}")
  if(ARG_FORM)
    _usdtpatch_choice(FORM "${ARG_FORM}" "nop5;combo5;combo10;nop1")
    target_compile_definitions(${target} PRIVATE USDTPATCH_SITE_FORM=${ARG_FORM})
  endif()
  if(ARG_REDZONE_GUARD AND ARG_NO_REDZONE_GUARD)
    message(FATAL_ERROR "usdtpatch_use_headers: REDZONE_GUARD and NO_REDZONE_GUARD together")
  elseif(ARG_REDZONE_GUARD)
    target_compile_definitions(${target} PRIVATE USDTPATCH_REDZONE_GUARD=1)
  elseif(ARG_NO_REDZONE_GUARD)
    target_compile_definitions(${target} PRIVATE USDTPATCH_REDZONE_GUARD=0)
  endif()
endfunction()

cmake_policy(POP)
set(usdtpatch_FOUND TRUE)
