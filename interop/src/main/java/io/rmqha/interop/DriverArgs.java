package io.rmqha.interop;

import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

/**
 * A driver's command line: {@code --key value} pairs and bare {@code --flag}s.  A missing
 * required key or a value that is not a number stops the driver with a message naming it.
 */
final class DriverArgs {
    private final Map<String, String> values = new HashMap<>();
    private final Set<String> flags = new HashSet<>();

    private DriverArgs() {
    }

    static DriverArgs parse(String[] args) {
        DriverArgs out = new DriverArgs();
        for (int i = 0; i < args.length; i++) {
            String arg = args[i];
            if (!arg.startsWith("--")) {
                throw new IllegalArgumentException("expected --key, got " + arg);
            }
            String key = arg.substring(2);
            if (i + 1 < args.length && !args[i + 1].startsWith("--")) {
                out.values.put(key, args[++i]);
            } else {
                out.flags.add(key);
            }
        }
        return out;
    }

    String need(String key) {
        String value = values.get(key);
        if (value == null) {
            throw new IllegalArgumentException("missing --" + key);
        }
        return value;
    }

    String or(String key, String fallback) {
        return values.getOrDefault(key, fallback);
    }

    int intOr(String key, int fallback) {
        String value = values.get(key);
        try {
            return value == null ? fallback : Integer.parseInt(value);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("--" + key + " is not a number: " + value, e);
        }
    }

    long longOr(String key, long fallback) {
        String value = values.get(key);
        try {
            return value == null ? fallback : Long.parseLong(value);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("--" + key + " is not a number: " + value, e);
        }
    }

    boolean flag(String key) {
        return flags.contains(key);
    }
}
