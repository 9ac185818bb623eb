// Bench.java: usdtpatch bench's JVM workload. With -XX:+ExtendedDTraceProbes every Java
// method call fires hotspot:method__entry and hotspot:method__return in libjvm.
public class Bench {
    static long step(long x) { return (x * 31 + 7) ^ (x >>> 3); }

    public static void main(String[] args) {
        long n = args.length > 0 ? Long.parseLong(args[0]) : 1000000L;
        long s = 0;
        for (long i = 0; i < n; i++) {
            s += step(i);
        }
        System.out.println("sum=" + s);
    }
}
