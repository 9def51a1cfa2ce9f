# qkv_layer(<name> SOURCES <files> [HEADERS <public headers>] [DEPENDS <layers below>] [LIBRARIES <libs>])
#
# One layer of qkv: the OBJECT library qkv_<name>, compiled from src/<name>/. Its include path is a
# view built here, layers/<name>/ in the build tree, holding only the layer's own public headers
# (as qkv/<h>, links into include/qkv/) and its own folder (as <name>/, for private headers), plus,
# through DEPENDS, the views of the layers below. A header of a layer above is not in any view the
# layer sees, so an upward include does not compile: the build, not discipline, keeps the layering.
# The installed package puts every public header in include/qkv/ as usual.
function(qkv_layer name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;HEADERS;DEPENDS;LIBRARIES")
  set(view ${PROJECT_BINARY_DIR}/layers/${name})
  file(REMOVE_RECURSE ${view})
  file(MAKE_DIRECTORY ${view}/qkv)
  foreach(header IN LISTS arg_HEADERS)
    if(NOT EXISTS ${PROJECT_SOURCE_DIR}/include/qkv/${header})
      message(FATAL_ERROR "qkv_layer(${name}): no include/qkv/${header}")
    endif()
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/qkv/${header} ${view}/qkv/${header} SYMBOLIC)
  endforeach()
  file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR} ${view}/${name} SYMBOLIC)

  add_library(qkv_${name} OBJECT ${arg_SOURCES})
  target_include_directories(qkv_${name} PUBLIC ${view})
  list(TRANSFORM arg_DEPENDS PREPEND qkv_)
  target_link_libraries(qkv_${name} PUBLIC qkv_flags ${arg_DEPENDS} PRIVATE ${arg_LIBRARIES})
  set_property(GLOBAL APPEND PROPERTY QKV_LAYERS qkv_${name})
  list(TRANSFORM arg_HEADERS PREPEND ${PROJECT_SOURCE_DIR}/include/qkv/)
  set_property(GLOBAL APPEND PROPERTY QKV_PUBLIC_HEADERS ${arg_HEADERS})
endfunction()
