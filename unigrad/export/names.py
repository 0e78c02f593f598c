"""Names: which names the public function of an exported C file may take.

The public function is an external symbol of a C (or C++) file that includes <stdint.h>,
<stddef.h> and <stdbool.h>, is compiled next to a caller's own code (which includes <stdio.h>,
<stdlib.h>, <math.h>...) and is linked with libc and libm. So its name must be a C identifier,
not a C or C++ keyword, not reserved to the implementation (`_x`, `__x`), and not a function,
macro or type of the C standard library or of the common POSIX calls: `void sin(const float*,
float*)` is an error under `-Werror` (a conflicting built-in), and a `read` or `malloc` defined in
the object would replace the library's for the whole program.
"""
from __future__ import annotations

import re

from unigrad.renderer.cstyle import C_TYPES, OOB_STATE

__all__ = ["name_problem"]

C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# C11, C23 and C++20 keywords, the alternative operator spellings of C++ and GNU's extensions
KEYWORDS = frozenset("""
auto break case char const continue default do double else enum extern float for goto if inline
int long register restrict return short signed sizeof static struct switch typedef union unsigned
void volatile while alignas alignof bool constexpr false nullptr static_assert thread_local true
typeof typeof_unqual asm fortran and and_eq bitand bitor catch char8_t char16_t char32_t class
compl concept consteval constinit const_cast co_await co_return co_yield decltype delete
dynamic_cast explicit export friend mutable namespace new noexcept not not_eq operator or or_eq
private protected public reinterpret_cast requires static_cast template this throw try typeid
typename using virtual wchar_t xor xor_eq
""".split())

# <math.h>: each function has a float (`f`) and a long double (`l`) twin
MATH = """
acos asin atan atan2 cos sin tan acosh asinh atanh cosh sinh tanh exp exp2 expm1 exp10 frexp ilogb
ldexp log log10 log1p log2 logb modf scalbn scalbln cbrt fabs hypot pow sqrt erf erfc lgamma tgamma
ceil floor nearbyint rint lrint llrint round lround llround trunc fmod remainder remquo copysign
nan nextafter nexttoward fdim fmax fmin fma sincos gamma j0 j1 jn y0 y1 yn
""".split()
MATH_MACROS = """
fpclassify isfinite isinf isnan isnormal signbit isgreater isgreaterequal isless islessequal
islessgreater isunordered
""".split()

# the other functions, macros and types of <stdlib.h>, <stdio.h>, <string.h>, <ctype.h>,
# <time.h>, <signal.h>, <setjmp.h>, <locale.h>, <assert.h>, <errno.h>, <stdarg.h>, <stddef.h>,
# common POSIX calls, and <stdint.h>'s integer types
LIBRARY = """
atof atoi atol atoll strtod strtof strtold strtol strtoll strtoul strtoull rand srand
aligned_alloc calloc free malloc realloc abort atexit at_quick_exit exit _Exit getenv quick_exit
system bsearch qsort abs labs llabs div ldiv lldiv mblen mbtowc wctomb mbstowcs wcstombs
remove rename tmpfile tmpnam fclose fflush fopen freopen setbuf setvbuf fprintf fscanf printf
scanf snprintf sprintf sscanf vfprintf vfscanf vprintf vscanf vsnprintf vsprintf vsscanf fgetc
fgets fputc fputs getc getchar gets putc putchar puts ungetc fread fwrite fgetpos fseek fsetpos
ftell rewind clearerr feof ferror perror
memcpy memmove strcpy strncpy strcat strncat memcmp strcmp strcoll strncmp strxfrm memchr strchr
strcspn strpbrk strrchr strspn strstr strtok memset strerror strlen strdup strndup
isalnum isalpha isblank iscntrl isdigit isgraph islower isprint ispunct isspace isupper isxdigit
tolower toupper
clock difftime mktime time asctime ctime gmtime localtime strftime timespec_get
signal raise setjmp longjmp setlocale localeconv assert errno offsetof
va_start va_arg va_end va_copy NULL EOF stdin stdout stderr
read write open close lseek fork execv execve execvp pipe dup dup2 kill sleep usleep unlink link
stat fstat lstat access chdir getpid mmap munmap mprotect select poll socket bind listen accept
connect send recv ioctl fcntl wait waitpid sigaction index rindex bzero
size_t ptrdiff_t max_align_t intptr_t uintptr_t intmax_t uintmax_t FILE fpos_t div_t ldiv_t
lldiv_t clock_t time_t jmp_buf va_list sig_atomic_t float_t double_t
""".split()
INT_TYPES = [f"{u}int{kind}{bits}_t" for u in ("", "u") for kind in ("", "_least", "_fast")
             for bits in (8, 16, 32, 64)]
LIBC = frozenset([*(f"{f}{t}" for f in MATH for t in ("", "f", "l")), *MATH_MACROS, *LIBRARY,
                  *INT_TYPES])


# file-scope names the kernels' helpers declare (renderer/cstyle.py): vector types (`float_v8`) and
# their unaligned twins (`float_v8_u`), and the out-of-bounds record of a CHECK_OOB build; the
# kernels themselves are renamed around the public name (numerical.py)
SCALARS = "|".join(sorted({ct.replace(" ", "_") for ct in C_TYPES.values()}))
VECTOR_TYPE = re.compile(rf"({SCALARS})_v[0-9]+(_u)?\Z")


def name_problem(name: str) -> str | None:
  """Why `name` cannot be the public function of an exported C file, or None if it can."""
  if not C_IDENTIFIER.match(name):
    return "is not a C identifier (ASCII letters, digits and _, not starting with a digit)"
  if name in KEYWORDS: return "is a C or C++ keyword"
  if name.startswith("_"): return "is reserved to the C implementation (it starts with _)"
  if name == "main": return "is the entry point of a C program"
  if name in LIBC:
    return ("is a function, macro or type of the C library (libc, libm, POSIX): the exported "
            "function would redeclare it")
  if VECTOR_TYPE.match(name) or name == OOB_STATE: return "is a name the kernels' code declares"
  return None
