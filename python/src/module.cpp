// The wavealign._core extension: errors translated to Python exceptions, then each part's bindings.
#include <Python.h>
#include <nanobind/nanobind.h>

#include <exception>

#include "bindings.h"
#include "wavealign/error.h"

namespace nb = nanobind;

NB_MODULE(_core, module) {
  module.doc() = "C++ core of wavealign: masks, plans, schedules, the CPU reference and the CUDA kernel";
  module.attr("__version__") = WA_VERSION;

  // A bad value from the caller is a ValueError (the message starts "invalid argument '<name>'"); any other
  // wavealign failure is a RuntimeError. InvalidArgument derives from Error, so it is caught first.
  nb::register_exception_translator([](const std::exception_ptr& error, void*) {
    try {
      std::rethrow_exception(error);
    } catch (const wavealign::InvalidArgument& invalid) {
      PyErr_SetString(PyExc_ValueError, invalid.what());
    } catch (const wavealign::Error& failure) {
      PyErr_SetString(PyExc_RuntimeError, failure.what());
    }
  });

  wavealign::python::bind_plan(module);
  wavealign::python::bind_reference(module);
  wavealign::python::bind_attention_checks(module);
  wavealign::python::bind_cuda(module);
  wavealign::python::bind_gpu_plan(module);
  wavealign::python::bind_methods(module);
}
