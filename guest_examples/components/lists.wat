;; lists.wat - a component whose exports move list<u8> values through two host imports, for timing
;; and testing byte-list crossings without wasi:nn around them.
;;
;; Imports: host.take(data: list<u8>) and host.give(n: u32) -> list<u8>.
;; Exports: take-n(size, count): `count` calls of take with `size` bytes from offset 0x100;
;;          give-n(size, count): `count` calls of give(size), the lists land at 32 MiB;
;;          give-take(size): give(size), then take of exactly what give delivered.
;; Memory: 64 MiB; realloc always answers 32 MiB (one list at a time).
(component
  (import "host" (instance $host
    (export "take" (func (param "data" (list u8))))
    (export "give" (func (param "n" u32) (result (list u8))))))
  (core module $libc
    (memory (export "memory") 1024)
    (func (export "realloc") (param i32 i32 i32 i32) (result i32) (i32.const 0x2000000)))
  (core instance $libc (instantiate $libc))
  (alias core export $libc "memory" (core memory $mem))
  (alias core export $libc "realloc" (core func $realloc))
  (alias export $host "take" (func $take))
  (alias export $host "give" (func $give))
  (core func $take_lowered (canon lower (func $take) (memory $mem)))
  (core func $give_lowered (canon lower (func $give) (memory $mem) (realloc $realloc)))
  (core module $loops
    (import "libc" "memory" (memory 1))
    (import "host" "take" (func $take (param i32 i32)))
    (import "host" "give" (func $give (param i32 i32)))
    (func (export "take-n") (param $size i32) (param $count i32)
      (block $done (loop $again
        (br_if $done (i32.eqz (local.get $count)))
        (call $take (i32.const 0x100) (local.get $size))
        (local.set $count (i32.sub (local.get $count) (i32.const 1)))
        (br $again))))
    (func (export "give-n") (param $size i32) (param $count i32)
      (block $done (loop $again
        (br_if $done (i32.eqz (local.get $count)))
        (call $give (local.get $size) (i32.const 16))
        (local.set $count (i32.sub (local.get $count) (i32.const 1)))
        (br $again))))
    (func (export "give-take") (param $size i32)
      (call $give (local.get $size) (i32.const 16))
      (call $take (i32.load (i32.const 16)) (i32.load (i32.const 20)))))
  (core instance $loops (instantiate $loops
    (with "libc" (instance $libc))
    (with "host" (instance (export "take" (func $take_lowered)) (export "give" (func $give_lowered))))))
  (func (export "take-n") (param "size" u32) (param "count" u32) (canon lift (core func $loops "take-n")))
  (func (export "give-n") (param "size" u32) (param "count" u32) (canon lift (core func $loops "give-n")))
  (func (export "give-take") (param "size" u32) (canon lift (core func $loops "give-take"))))
