#include "bare_new.h"

#include <string>

namespace qkvpy {

void refuse_bare_new(const py::handle& cls) {
  auto* type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  const newfunc slot = type->tp_new;
  const std::string name = py::str(cls.attr("__name__"));
  const py::cpp_function refuse(
      [type, slot, name](const py::args& args, const py::kwargs&) -> py::object {
        // A Python subclass's tp_new goes through this attribute, also when the subclass is called:
        // those keep pybind11's own (which checks there that the base's __init__ ran).
        if (!args.empty() && PyType_Check(args[0].ptr()) && args[0].ptr() != reinterpret_cast<PyObject*>(type) &&
            PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(args[0].ptr()), type)) {
          PyObject* made = slot(reinterpret_cast<PyTypeObject*>(args[0].ptr()), py::tuple().ptr(), nullptr);
          if (made == nullptr) throw py::error_already_set();
          return py::reinterpret_steal<py::object>(made);
        }
        throw py::type_error(name + ".__new__ alone would make an object with no state; create one by calling " + name +
                             "(...) (copy and pickle are not supported)");
      },
      py::name("__new__"));
  // Written into the type's dict directly: setattr would also replace the tp_new slot that
  // type.__call__ uses, and then constructing the class would raise as well.
  if (PyDict_SetItemString(type->tp_dict, "__new__", py::staticmethod(refuse).ptr()) != 0)
    throw py::error_already_set();
  PyType_Modified(type);
}

}  // namespace qkvpy
